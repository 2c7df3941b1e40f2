#include "kernels/cuda/paged_attention.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/reduce.cuh"

namespace troupe::cuda {

namespace {

__device__ inline int64_t kv_offset(const paged_kv_layer& kv, uint32_t block, int32_t head) {
  return (int64_t{block} * kv.num_kv_heads + head) * kv.block_size * kv.head_dim;
}

__global__ void kv_write_kernel(paged_kv_layer kv, const float* k, const float* v, int64_t stride, token_batch b) {
  const int32_t t = blockIdx.x;
  const int32_t pos = b.positions[t];
  const uint32_t block = b.tables[int64_t{b.token_seq[t]} * b.table_stride + pos / kv.block_size];
  const int32_t slot = pos % kv.block_size;
  for (int32_t i = threadIdx.x; i < kv.num_kv_heads * kv.head_dim; i += blockDim.x) {
    const int32_t h = i / kv.head_dim, d = i % kv.head_dim;
    const int64_t base = kv_offset(kv, block, h);
    kv.k[base + int64_t{d} * kv.block_size + slot] = k[int64_t{t} * stride + i];
    kv.v[base + int64_t{slot} * kv.head_dim + d] = v[int64_t{t} * stride + i];
  }
}

// Partials of one (split, head, token): [max, sum, acc[head_dim]] at part.
__global__ void attention_partial_kernel(const float* q, int64_t q_stride, token_batch b, int32_t num_heads,
                                         paged_kv_layer kv, float* workspace, int32_t split, int32_t num_splits) {
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
  for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[int64_t{t} * q_stride + int64_t{h} * hd + d];
  __syncthreads();
  float local_max = -INFINITY;
  for (int32_t p = start + threadIdx.x; p < end; p += blockDim.x) {
    const float* kp = kv.k + kv_offset(kv, table[p / kv.block_size], kvh) + p % kv.block_size;
    float dot = 0.0f;
    for (int32_t d = 0; d < hd; ++d) dot += qs[d] * kp[int64_t{d} * kv.block_size];
    dot *= scale;
    scores[p - start] = dot;
    local_max = fmaxf(local_max, dot);
  }
  const float m = detail::block_max(local_max);
  float local_sum = 0.0f;
  for (int32_t p = start + threadIdx.x; p < end; p += blockDim.x) {
    const float e = expf(scores[p - start] - m);
    scores[p - start] = e;
    local_sum += e;
  }
  const float l = detail::block_sum(local_sum);  // its barrier also publishes scores
  for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int32_t p = start; p < end; ++p)
      acc += scores[p - start] * kv.v[kv_offset(kv, table[p / kv.block_size], kvh) + int64_t{p % kv.block_size} * hd + d];
    part[2 + d] = acc;
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

size_t paged_attention_workspace(int32_t num_tokens, int32_t num_heads, int32_t head_dim, int32_t max_position,
                                 int32_t split) {
  const int64_t splits = (int64_t{max_position} + split) / split;
  return static_cast<size_t>(int64_t{num_tokens} * num_heads * splits * (head_dim + 2));
}

void paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride, const token_batch& b,
                     int32_t num_heads, int32_t max_position, const paged_kv_layer& kv, float* workspace, int32_t split,
                     cudaStream_t stream) {
  if (b.num_tokens == 0) return;
  if (split < 32 || split > 1024 || split % 32 != 0) throw cuda_error("paged_attention: split must be 32..1024, a multiple of 32");
  const int32_t num_splits = static_cast<int32_t>((int64_t{max_position} + split) / split);
  const size_t shared = sizeof(float) * (static_cast<size_t>(kv.head_dim) + static_cast<size_t>(split));
  attention_partial_kernel<<<dim3(num_splits, num_heads, b.num_tokens), 128, shared, stream>>>(q, q_stride, b, num_heads, kv,
                                                                                               workspace, split, num_splits);
  check_launch("paged_attention (partials)");
  attention_merge_kernel<<<dim3(num_heads, b.num_tokens), 128, 0, stream>>>(out, out_stride, num_heads, kv.head_dim,
                                                                            workspace, num_splits);
  check_launch("paged_attention (merge)");
}

}  // namespace troupe::cuda
