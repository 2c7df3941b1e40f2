#include "kernels/cuda/prefill_attention.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/reduce.cuh"

namespace troupe::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kRows = prefill_tile_rows;

size_t shared_floats(int32_t hd, int32_t bs) {
  // q and the accumulator [rows][hd], K [bs][hd + 1] (padded: no bank conflicts when
  // each thread reads a key), V [bs][hd], scores [rows][bs], per row max, sum and rescale.
  return size_t(2 * kRows) * hd + size_t(bs) * (hd + 1) + size_t(bs) * hd + size_t(kRows) * bs + 3 * kRows;
}

__global__ void __launch_bounds__(kThreads) prefill_kernel(const float* q, int64_t q_stride, float* out,
                                                           int64_t out_stride, token_batch b, const query_tile* tiles,
                                                           int32_t num_heads, paged_kv_layer kv) {
  extern __shared__ float sm[];
  const query_tile tile = tiles[blockIdx.x];
  const int32_t h = blockIdx.y;
  const int32_t hd = kv.head_dim, bs = kv.block_size, rows = tile.rows;
  float* qs = sm;
  float* acc = qs + kRows * hd;
  float* ks = acc + kRows * hd;
  float* vs = ks + bs * (hd + 1);
  float* ss = vs + bs * hd;
  float* row_max = ss + kRows * bs;
  float* row_sum = row_max + kRows;
  float* row_scale = row_sum + kRows;
  const int32_t kvh = h / (num_heads / kv.num_kv_heads);
  const int32_t t0 = tile.first_token;
  const uint32_t* table = b.tables + int64_t{b.token_seq[t0]} * b.table_stride;
  const int32_t pos0 = b.positions[t0], last = pos0 + rows - 1;
  const float scale = rsqrtf(static_cast<float>(hd));
  for (int32_t i = threadIdx.x; i < rows * hd; i += blockDim.x) {
    const int32_t r = i / hd, d = i % hd;
    qs[i] = q[int64_t{t0 + r} * q_stride + int64_t{h} * hd + d];
    acc[i] = 0.0f;
  }
  if (threadIdx.x < kRows) row_max[threadIdx.x] = -INFINITY, row_sum[threadIdx.x] = 0.0f;
  const int32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int32_t blk = 0; blk * bs <= last; ++blk) {
    const int64_t base = (int64_t{table[blk]} * kv.num_kv_heads + kvh) * bs * hd;
    __syncthreads();  // the previous block's K, V and scores are used up
    for (int32_t i = threadIdx.x; i < hd * bs; i += blockDim.x) {
      const int32_t d = i / bs, s = i % bs;  // K is stored dimension-major in its block
      ks[s * (hd + 1) + d] = kv.k[base + i];
      vs[i] = kv.v[base + i];  // V slot-major, as staged
    }
    __syncthreads();
    for (int32_t i = threadIdx.x; i < rows * bs; i += blockDim.x) {
      const int32_t r = i / bs, s = i % bs;
      float dot = -INFINITY;
      if (blk * bs + s <= pos0 + r) {
        dot = 0.0f;
        for (int32_t d = 0; d < hd; ++d) dot += qs[r * hd + d] * ks[s * (hd + 1) + d];
        dot *= scale;
      }
      ss[i] = dot;
    }
    __syncthreads();
    // Online softmax, a warp per row: the new max, this block's weights, the rescale.
    for (int32_t r = warp; r < rows; r += warps) {
      const float x = lane < bs ? ss[r * bs + lane] : -INFINITY;
      const float m = fmaxf(row_max[r], detail::warp_max(x));
      const float e = x == -INFINITY ? 0.0f : expf(x - m);
      if (lane < bs) ss[r * bs + lane] = e;
      const float sum = detail::warp_sum(e);
      if (lane == 0) {
        const float f = row_max[r] == -INFINITY ? 0.0f : expf(row_max[r] - m);
        row_sum[r] = row_sum[r] * f + sum;
        row_max[r] = m;
        row_scale[r] = f;
      }
    }
    __syncthreads();
    for (int32_t i = threadIdx.x; i < rows * hd; i += blockDim.x) {
      const int32_t r = i / hd, d = i % hd;
      float a = acc[i] * row_scale[r];
      for (int32_t s = 0; s < bs; ++s) a += ss[r * bs + s] * vs[s * hd + d];
      acc[i] = a;
    }
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < rows * hd; i += blockDim.x) {
    const int32_t r = i / hd, d = i % hd;
    out[int64_t{t0 + r} * out_stride + int64_t{h} * hd + d] = acc[i] / row_sum[r];
  }
}

}  // namespace

void prefill_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride, const token_batch& b,
                       const query_tile* tiles, int32_t num_tiles, int32_t num_heads, const paged_kv_layer& kv,
                       cudaStream_t stream) {
  if (num_tiles == 0) return;
  if (kv.block_size > 32 || kv.head_dim > 256) throw cuda_error("prefill_attention: block_size above 32 or head_dim above 256");
  const size_t shared = sizeof(float) * shared_floats(kv.head_dim, kv.block_size);
  check(cudaFuncSetAttribute(prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)),
        "prefill_attention: cudaFuncSetAttribute");
  prefill_kernel<<<dim3(num_tiles, num_heads), kThreads, shared, stream>>>(q, q_stride, out, out_stride, b, tiles,
                                                                          num_heads, kv);
  check_launch("prefill_attention");
}

}  // namespace troupe::cuda
