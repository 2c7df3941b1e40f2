// tp_slice: which part of each layer a tensor-parallel shard computes (Megatron split).
// Rank r of n owns query heads [r*H/n, (r+1)*H/n), the matching KV heads and FFN columns
// [r*F/n, (r+1)*F/n); its attention-output and FFN-down products are partial sums that
// the shards of a stage add together (collective::all_reduce_sum).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/model/config.hpp"

namespace troupe {

struct tp_slice {
  int32_t rank = 0;
  int32_t size = 1;
};

// Why a model cannot be split n ways (heads, KV heads or FFN columns not divisible, or a
// slice that would cut a quantization group), or nullopt if it can.
std::optional<std::string> check_tp_split(const model_config& c, int32_t n, int32_t q8_group_size);

}  // namespace troupe
