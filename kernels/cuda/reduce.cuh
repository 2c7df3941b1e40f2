// Block-wide reductions for the kernels in this directory (device code only).
#pragma once

namespace troupe::cuda::detail {

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ inline float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? part[lane] : 0.0f;
  return warp_sum(v);
}

__device__ inline float block_max(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? part[lane] : -INFINITY;
  return warp_max(v);
}

// Prefers the larger value, then the lower index (the CPU's first maximum).
__device__ inline void better(float& v, int32_t& i, float ov, int32_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// The index of the first largest of row[0..n), for every thread of the block (NaN never
// wins; every value NaN or -inf: 0, as the CPU's loop leaves it).
__device__ inline int32_t block_argmax(const float* row, int32_t n) {
  __shared__ float vs[32];
  __shared__ int32_t is[32];
  float v = -INFINITY;
  int32_t idx = n;  // beyond every real index
#pragma unroll 8
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) better(v, idx, row[i], i);
  for (int o = 16; o > 0; o >>= 1) better(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // vs and is may still be read by a previous call
  if (lane == 0) {
    vs[warp] = v;
    is[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) better(v, idx, vs[w], is[w]);
    is[0] = idx < n ? idx : 0;
  }
  __syncthreads();
  return is[0];
}

}  // namespace troupe::cuda::detail
