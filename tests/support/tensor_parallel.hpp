// Tensor-parallel shards of one stage stepped together, for the tests that compare a split
// (on CPUs or GPUs) with the whole model.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/forward/forward_shard.hpp"
#include "engine/model/config.hpp"

namespace troupe::test {

// Every step's logits (rank 0's) and the greedy token chosen from them.
struct tp_run {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

// A small shape whose heads, KV heads and FFN columns split two ways, also in Q8_0 groups
// of 32.
model_config splittable_config();

// The KV blocks 0, 1, ... that a sequence of `tokens` tokens needs, in blocks of 16.
std::vector<block_id> blocks_for(int32_t tokens);

// The prompt in one step, then one greedy token a step, `steps` steps in all, on the ranks
// of one stage (shards[r] is rank r), each rank's forward on a thread of its own (the
// all-reduce waits for every rank).
tp_run run_steps(const std::vector<forward_shard*>& shards, const model_config& c, std::vector<int32_t> prompt,
                 int32_t steps, const std::vector<block_id>& blocks);

// The largest logit difference of any step, relative to that step's largest logit in `a`
// (tolerance.hpp: infinite where a logit is not finite).
double worst_relative_difference(const tp_run& a, const tp_run& b);

}  // namespace troupe::test
