// rope on the device, in place for num_tokens tokens of v ([num_tokens][stride], num_heads
// heads of head_dim each), token t at positions[t]; cos/sin tables [positions][rot_dim/2].
// CPU reference: kernels/cpu/rope.hpp (one token).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/rope.hpp"

namespace troupe::cuda {

void rope(float* v, int64_t stride, int32_t num_tokens, int32_t num_heads, int32_t head_dim, int32_t rot_dim,
          const float* cos_table, const float* sin_table, const int32_t* positions, rope_layout layout,
          cudaStream_t stream);

}  // namespace troupe::cuda
