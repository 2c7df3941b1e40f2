#include "kernels/cuda/paged_attention.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rows.cuh"

namespace troupe::cuda {

namespace {

__device__ inline int64_t kv_offset(const paged_kv_layer& kv, uint32_t block, int32_t head) {
  return (int64_t{block} * kv.num_kv_heads + head) * kv.block_size * kv.head_dim;
}

// Token t's K and V rows ([num_kv_heads * head_dim] each) into its slot; the whole block
// takes the token.
__device__ inline void write_token(const paged_kv_layer& kv, const token_batch& b, int32_t t, const float* k,
                                   const float* v) {
  const int32_t pos = b.positions[t];
  const uint32_t block = b.tables[int64_t{b.token_seq[t]} * b.table_stride + pos / kv.block_size];
  const int32_t slot = pos % kv.block_size;
  for (int32_t i = threadIdx.x; i < kv.num_kv_heads * kv.head_dim; i += blockDim.x) {
    const int32_t h = i / kv.head_dim, d = i % kv.head_dim;
    const int64_t base = kv_offset(kv, block, h);
    kv.k[base + int64_t{d} * kv.block_size + slot] = k[i];
    kv.v[base + int64_t{slot} * kv.head_dim + d] = v[i];
  }
}

__global__ void kv_write_kernel(paged_kv_layer kv, const float* k, const float* v, int64_t stride, token_batch b) {
  write_token(kv, b, blockIdx.x, k + int64_t{blockIdx.x} * stride, v + int64_t{blockIdx.x} * stride);
}

// q . k for a key stored down its block ([head_dim][block_size]); D, when not 0, is
// head_dim at compile time, so every load of the key is in flight at once.
template <int D>
__device__ inline float dot_k(const float* qs, const float* kp, int32_t block_size, int32_t hd = D) {
  float dot = 0.0f;
  if constexpr (D > 0) {
#pragma unroll
    for (int32_t d = 0; d < D; ++d) dot += qs[d] * kp[int64_t{d} * block_size];
  } else {
#pragma unroll 8
    for (int32_t d = 0; d < hd; ++d) dot += qs[d] * kp[int64_t{d} * block_size];
  }
  return dot;
}

// rope over Q's and K's heads of token blockIdx.x's [q | k | v] row, then its K and V into
// the cache.
__global__ void rope_kv_write_kernel(paged_kv_layer kv, float* qkv, int64_t stride, int32_t num_heads, int32_t rot_dim,
                                     const float* cos_table, const float* sin_table, bool halves, token_batch b) {
  const int32_t t = blockIdx.x;
  const int32_t pos = b.positions[t];
  const int32_t hd = kv.head_dim, pairs = rot_dim / 2;
  float* row = qkv + int64_t{t} * stride;
  for (int32_t i = threadIdx.x; i < (num_heads + kv.num_kv_heads) * pairs; i += blockDim.x) {
    const int32_t head = i / pairs, pair = i % pairs;
    detail::rotate_pair(row + int64_t{head} * hd, pair, pairs, halves, cos_table[int64_t{pos} * pairs + pair],
                        sin_table[int64_t{pos} * pairs + pair]);
  }
  __syncthreads();
  const float* k = row + int64_t{num_heads} * hd;
  write_token(kv, b, t, k, k + int64_t{kv.num_kv_heads} * hd);
}

// Partials of one (split, head, token): [max, sum, acc[head_dim]] at part; with a single
// split, the output itself (acc / sum, what the merge would compute) into out.
__global__ void attention_partial_kernel(const float* q, int64_t q_stride, token_batch b, int32_t num_heads,
                                         paged_kv_layer kv, float* workspace, int32_t split, int32_t num_splits,
                                         float* out, int64_t out_stride) {
  extern __shared__ float shared[];
  const int32_t s = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
  const int32_t hd = kv.head_dim;
  float* part = workspace + ((int64_t{t} * num_heads + h) * num_splits + s) * (hd + 2);
  const int32_t pos = b.positions[t];
  const int32_t start = s * split;
  if (start > pos) {
    for (int32_t d = threadIdx.x; d < hd + 2; d += blockDim.x) part[d] = d == 0 ? -INFINITY : 0.0f;
    return;
  }
  const int32_t end = min(pos + 1, start + split);
  const int32_t kvh = h / (num_heads / kv.num_kv_heads);
  const uint32_t* table = b.tables + int64_t{b.token_seq[t]} * b.table_stride;
  float* qs = shared;           // [hd]
  float* scores = shared + hd;  // [split]
  const float scale = rsqrtf(static_cast<float>(hd));
  // A token tree's nodes that are not this token's ancestors weigh nothing.
  const int32_t tree_first = b.tree_first ? b.tree_first[t] : -1;
  const uint64_t tree_mask = tree_first >= 0 ? b.tree_mask[t] : 0;
  for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[int64_t{t} * q_stride + int64_t{h} * hd + d];
  __syncthreads();
  float local_max = -INFINITY;
  for (int32_t p = start + threadIdx.x; p < end; p += blockDim.x) {
    const float* kp = kv.k + kv_offset(kv, table[p / kv.block_size], kvh) + p % kv.block_size;
    float dot = (hd == 64    ? dot_k<64>(qs, kp, kv.block_size)
                 : hd == 128 ? dot_k<128>(qs, kp, kv.block_size)
                             : dot_k<0>(qs, kp, kv.block_size, hd)) *
                scale;
    if (tree_first >= 0 && p >= tree_first && !((tree_mask >> (p - tree_first)) & 1u)) dot = -INFINITY;
    scores[p - start] = dot;
    local_max = fmaxf(local_max, dot);
  }
  const float m = detail::block_max(local_max);
  float local_sum = 0.0f;
  for (int32_t p = start + threadIdx.x; p < end; p += blockDim.x) {
    // (A split whose positions are all masked has m = -inf: each weighs nothing, and the
    // merge skips its partial.)
    const float e = m == -INFINITY ? 0.0f : expf(scores[p - start] - m);
    scores[p - start] = e;
    local_sum += e;
  }
  const float l = detail::block_sum(local_sum);  // its barrier also publishes scores
  // Values: each warp takes every warps-th position, its lanes the head dimensions (at most
  // 8 each); the warps' sums meet in shared memory.
  const int32_t warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float acc[8] = {};
#pragma unroll 4
  for (int32_t p = start + warp; p < end; p += warps) {
    const float sp = scores[p - start];
    const float* vp = kv.v + kv_offset(kv, table[p / kv.block_size], kvh) + int64_t{p % kv.block_size} * hd;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (lane + 32 * i < hd) acc[i] += sp * vp[lane + 32 * i];
  }
  float* sums = scores + split;  // [warps][hd]
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (lane + 32 * i < hd) sums[warp * hd + lane + 32 * i] = acc[i];
  __syncthreads();
  for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.0f;
    for (int32_t w = 0; w < warps; ++w) sum += sums[w * hd + d];
    if (num_splits == 1)
      out[int64_t{t} * out_stride + int64_t{h} * hd + d] = sum / l;  // the merge of one partial
    else
      part[2 + d] = sum;
  }
  if (threadIdx.x == 0) {
    part[0] = m;
    part[1] = l;
  }
}

// The exact merge: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
__global__ void attention_merge_kernel(float* out, int64_t out_stride, int32_t num_heads, int32_t head_dim,
                                       const float* workspace, int32_t num_splits) {
  const int32_t h = blockIdx.x, t = blockIdx.y;
  const float* parts = workspace + (int64_t{t} * num_heads + h) * num_splits * (head_dim + 2);
  float m = -INFINITY;
  for (int32_t s = 0; s < num_splits; ++s) m = fmaxf(m, parts[s * (head_dim + 2)]);
  float l = 0.0f;
  for (int32_t s = 0; s < num_splits; ++s) {
    const float* p = parts + s * (head_dim + 2);
    if (p[0] != -INFINITY) l += p[1] * expf(p[0] - m);
  }
  for (int32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int32_t s = 0; s < num_splits; ++s) {
      const float* p = parts + s * (head_dim + 2);
      if (p[0] != -INFINITY) acc += p[2 + d] * expf(p[0] - m);
    }
    out[int64_t{t} * out_stride + int64_t{h} * head_dim + d] = acc / l;
  }
}

}  // namespace

void paged_kv_write(const paged_kv_layer& kv, const float* k, const float* v, int64_t stride, const token_batch& b,
                    cudaStream_t stream) {
  if (b.num_tokens == 0) return;
  kv_write_kernel<<<b.num_tokens, 128, 0, stream>>>(kv, k, v, stride, b);
  check_launch("paged_kv_write");
}

int32_t paged_attention_splits(int32_t max_position, int32_t split) {
  return static_cast<int32_t>((int64_t{max_position} + split) / split);
}

void rope_kv_write(const paged_kv_layer& kv, float* qkv, int64_t stride, int32_t num_heads, int32_t rot_dim,
                   const float* cos_table, const float* sin_table, rope_layout layout, const token_batch& b,
                   cudaStream_t stream) {
  if (b.num_tokens == 0) return;
  rope_kv_write_kernel<<<b.num_tokens, 128, 0, stream>>>(kv, qkv, stride, num_heads, rot_dim, cos_table, sin_table,
                                                         layout == rope_layout::halves, b);
  check_launch("rope_kv_write");
}

size_t paged_attention_workspace(int32_t num_tokens, int32_t num_heads, int32_t head_dim, int32_t max_position,
                                 int32_t split) {
  const int64_t splits = paged_attention_splits(max_position, split);
  return static_cast<size_t>(int64_t{num_tokens} * num_heads * splits * (head_dim + 2));
}

void paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride, const token_batch& b,
                     int32_t num_heads, int32_t max_position, const paged_kv_layer& kv, float* workspace, int32_t split,
                     cudaStream_t stream) {
  if (b.num_tokens == 0) return;
  if (split < 32 || split > 1024 || split % 32 != 0) throw cuda_error("paged_attention: split must be 32..1024, a multiple of 32");
  const int32_t num_splits = paged_attention_splits(max_position, split);
  if (kv.head_dim > 256) throw cuda_error("paged_attention: head_dim above 256");
  constexpr int threads = 256;
  const size_t shared = sizeof(float) * (static_cast<size_t>(kv.head_dim) * (1 + threads / 32) + static_cast<size_t>(split));
  attention_partial_kernel<<<dim3(num_splits, num_heads, b.num_tokens), threads, shared, stream>>>(
      q, q_stride, b, num_heads, kv, workspace, split, num_splits, out, out_stride);
  check_launch("paged_attention (partials)");
  if (num_splits == 1) return;  // the partials were the output
  attention_merge_kernel<<<dim3(num_heads, b.num_tokens), 128, 0, stream>>>(out, out_stride, num_heads, kv.head_dim,
                                                                            workspace, num_splits);
  check_launch("paged_attention (merge)");
}

}  // namespace troupe::cuda
