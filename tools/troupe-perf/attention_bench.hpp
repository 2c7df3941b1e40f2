// Decode-step attention alone: every sequence of a batch reads its whole cache once per
// layer, from blocks scattered over the pool (as a serving engine's are), so that the
// figure is the cache's read rate, to set beside the machine's memory bandwidth.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe::tools {

struct attention_shape {
  int32_t sequences = 16;
  int32_t context = 200;  // positions each sequence attends to
  int32_t layers = 12;
  int32_t heads = 12;
  int32_t kv_heads = 12;
  int32_t head_dim = 64;
  dtype cache = dtype::f16;  // f32, f16 or q8_0
};

struct attention_rate {
  double step_ms;    // all layers once, median of the runs
  double cache_gbs;  // bytes of K and V (scales included) read per second
  double cache_mb;   // bytes of K and V one step reads
};

attention_rate measure_attention(const attention_shape& s, thread_pool& pool, int runs);

}  // namespace troupe::tools
