#include "kernels/cuda/rmsnorm.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/reduce.cuh"

namespace troupe::cuda {

namespace {

__global__ void rmsnorm_kernel(float* out, const float* x, int64_t stride, const float* weight, int32_t n, float eps) {
  const float* row = x + int64_t{blockIdx.x} * stride;
  float* o = out + int64_t{blockIdx.x} * stride;
  float ss = 0.0f;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) ss += row[i] * row[i];
  ss = detail::block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = weight[i] * (inv * row[i]);
}

}  // namespace

void rmsnorm(float* out, const float* x, int64_t stride, const float* weight, int32_t rows, int32_t n, float eps,
             cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_kernel<<<rows, 256, 0, stream>>>(out, x, stride, weight, n, eps);
  check_launch("rmsnorm");
}

}  // namespace troupe::cuda
