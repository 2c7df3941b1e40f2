#include "kernels/cuda/rmsnorm.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/types.cuh"

namespace troupe::cuda {

namespace {

template <typename T>
__global__ void rmsnorm_kernel(T* out, int64_t out_stride, const float* x, int64_t stride, const float* weight, int32_t n,
                               float eps) {
  const float* row = x + int64_t{blockIdx.x} * stride;
  T* o = out + int64_t{blockIdx.x} * out_stride;
  float ss = 0.0f;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) ss += row[i] * row[i];
  ss = detail::block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = detail::from_float<T>(weight[i] * (inv * row[i]));
}

}  // namespace

void rmsnorm(float* out, const float* x, int64_t stride, const float* weight, int32_t rows, int32_t n, float eps,
             cudaStream_t stream) {
  rmsnorm_to(dtype::f32, out, stride, x, stride, weight, rows, n, eps, stream);
}

void rmsnorm_to(dtype out_type, void* out, int64_t out_stride, const float* x, int64_t stride, const float* weight,
                int32_t rows, int32_t n, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  detail::with_type(out_type, "rmsnorm", [&](auto t) {
    using T = decltype(t);
    rmsnorm_kernel<<<rows, 256, 0, stream>>>(static_cast<T*>(out), out_stride, x, stride, weight, n, eps);
  });
  check_launch("rmsnorm");
}

}  // namespace troupe::cuda
