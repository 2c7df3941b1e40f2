#include "kernels/cuda/rmsnorm.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/rows.cuh"

namespace troupe::cuda {

namespace {

template <typename T>
__global__ void rmsnorm_kernel(T* out, int64_t out_stride, const float* x, int64_t stride, const float* weight, int32_t n,
                               float eps) {
  detail::rmsnorm_row(out + int64_t{blockIdx.x} * out_stride, x + int64_t{blockIdx.x} * stride, weight, n, eps);
}

}  // namespace

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
