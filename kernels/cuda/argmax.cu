#include "kernels/cuda/argmax.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/reduce.cuh"

namespace troupe::cuda {

namespace {

// One block of 1024 threads per row.
__global__ void argmax_kernel(const float* x, int64_t stride, int32_t n, int32_t* out) {
  const int32_t i = detail::block_argmax(x + int64_t{blockIdx.x} * stride, n);
  if (threadIdx.x == 0) out[blockIdx.x] = i;
}

}  // namespace

void argmax(const float* x, int64_t stride, int32_t rows, int32_t n, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<rows, 1024, 0, stream>>>(x, stride, n, out);
  check_launch("argmax");
}

}  // namespace troupe::cuda
