#include "kernels/cuda/rope.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/rows.cuh"

namespace troupe::cuda {

namespace {

// One thread per (token, head, pair).
__global__ void rope_kernel(float* v, int64_t stride, int32_t num_tokens, int32_t num_heads, int32_t head_dim,
                            int32_t rot_dim, const float* cos_table, const float* sin_table, const int32_t* positions,
                            bool halves) {
  const int32_t pairs = rot_dim / 2;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{num_tokens} * num_heads * pairs) return;
  const int32_t pair = static_cast<int32_t>(i % pairs);
  const int32_t head = static_cast<int32_t>((i / pairs) % num_heads);
  const int32_t t = static_cast<int32_t>(i / (int64_t{pairs} * num_heads));
  const int64_t row = int64_t{positions[t]} * pairs;
  const float c = cos_table[row + pair], s = sin_table[row + pair];
  detail::rotate_pair(v + int64_t{t} * stride + int64_t{head} * head_dim, pair, pairs, halves, c, s);
}

}  // namespace

void rope(float* v, int64_t stride, int32_t num_tokens, int32_t num_heads, int32_t head_dim, int32_t rot_dim,
          const float* cos_table, const float* sin_table, const int32_t* positions, rope_layout layout,
          cudaStream_t stream) {
  const int64_t n = int64_t{num_tokens} * num_heads * (rot_dim / 2);
  if (n == 0) return;
  rope_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(v, stride, num_tokens, num_heads, head_dim,
                                                                          rot_dim, cos_table, sin_table, positions,
                                                                          layout == rope_layout::halves);
  check_launch("rope");
}

}  // namespace troupe::cuda
