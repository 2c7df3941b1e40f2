// Row operations shared by the kernels of this directory (device code only): the norm of
// a row and SiLU x up, each with one definition whether a kernel of its own (rmsnorm,
// silu_mul) or the GEMV staging its input computes it.
#pragma once

#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/types.cuh"

namespace troupe::cuda::detail {

// out[i] = weight[i] * x[i] / sqrt(mean(x^2) + eps), as T; the whole block takes the row.
template <typename T>
__device__ inline void rmsnorm_row(T* out, const float* row, const float* weight, int32_t n, float eps) {
  float ss = 0.0f;
#pragma unroll 4
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) ss += row[i] * row[i];
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
#pragma unroll 4
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = from_float<T>(weight[i] * (inv * row[i]));
}

__device__ inline float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// RoPE: turns pair `pair` of a head by the angle whose cosine and sine are c and s; pairs
// are (2i, 2i + 1) (llama2.c, GGUF) or, with halves, (i, i + pairs) (HF checkpoints).
__device__ inline void rotate_pair(float* head, int32_t pair, int32_t pairs, bool halves, float c, float s) {
  const int32_t a = halves ? pair : 2 * pair, b = halves ? pair + pairs : 2 * pair + 1;
  const float x0 = head[a], x1 = head[b];
  head[a] = x0 * c - x1 * s;
  head[b] = x0 * s + x1 * c;
}

}  // namespace troupe::cuda::detail
