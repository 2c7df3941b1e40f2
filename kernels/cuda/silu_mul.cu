#include "kernels/cuda/silu_mul.hpp"

#include "kernels/cuda/device.hpp"

namespace troupe::cuda {

namespace {

__global__ void silu_mul_kernel(float* gate, const float* up, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  gate[i] = g / (1.0f + expf(-g)) * up[i];
}

}  // namespace

void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  silu_mul_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(gate, up, n);
  check_launch("silu_mul");
}

}  // namespace troupe::cuda
