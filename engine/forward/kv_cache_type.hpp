// kv_cache_type: what a CPU shard's KV cache holds its keys and values in. F32 for F32
// weights (exact against the F32 references), F16 for quantized and 16-bit weights (as
// llama.cpp keeps it: half the memory traffic of long contexts), or q8_0 (int8 with a scale
// per token and KV head: a quarter of F32's traffic, lossy) where asked for: by a
// topology's [kv] cache_type, or by TROUPE_KV_TYPE=f32|f16|q8_0 in the environment, which
// every tool and node reads.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "engine/model/model.hpp"
#include "engine/util/expected.hpp"
#include "kernels/common/dtype.hpp"

namespace troupe {

// The type for model `m`: TROUPE_KV_TYPE when it is set to a valid name, else F32 for F32
// weights and F16 for the others.
dtype kv_cache_type_for(const model& m);
// TROUPE_KV_TYPE as set (nullopt when unset), or an error naming the value and the choices;
// tools check it before they start (kv_cache_type_for ignores a bad value).
expected<std::optional<dtype>> kv_cache_type_from_environment();
// A type by name ("f32", "f16", "q8_0"), or an error naming the choices; `what` says where
// the name came from.
expected<dtype> kv_cache_type_named(std::string_view name, const std::string& what);

}  // namespace troupe
