#include "kernels/cuda/argmax.hpp"

#include "kernels/cuda/device.hpp"

namespace troupe::cuda {

namespace {

// Prefers the larger value, then the lower index (the CPU's first maximum).
__device__ inline void better(float& v, int32_t& i, float ov, int32_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// One block of 1024 threads per row.
__global__ void argmax_kernel(const float* x, int64_t stride, int32_t n, int32_t* out) {
  const float* row = x + int64_t{blockIdx.x} * stride;
  float v = -INFINITY;
  int32_t idx = n;  // beyond every real index
#pragma unroll 8
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) better(v, idx, row[i], i);
  for (int o = 16; o > 0; o >>= 1) better(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  __shared__ float vs[32];
  __shared__ int32_t is[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    vs[warp] = v;
    is[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) better(v, idx, vs[w], is[w]);
    // Every value NaN or -inf: index 0, as the CPU's loop leaves it.
    out[blockIdx.x] = idx < n ? idx : 0;
  }
}

}  // namespace

void argmax(const float* x, int64_t stride, int32_t rows, int32_t n, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<rows, 1024, 0, stream>>>(x, stride, n, out);
  check_launch("argmax");
}

}  // namespace troupe::cuda
