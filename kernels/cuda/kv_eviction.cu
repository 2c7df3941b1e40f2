#include "kernels/cuda/kv_eviction.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rows.cuh"

namespace troupe::cuda {

namespace {

__device__ inline int64_t kv_offset(const paged_kv_layer& kv, uint32_t block, int32_t head) {
  return (int64_t{block} * kv.num_kv_heads + head) * kv.block_size * kv.head_dim;
}

// q . k_p / sqrt(head_dim) for query row qh (one head) and the key at slot p of `table`.
__device__ inline float score(const float* qh, const paged_kv_layer& kv, const uint32_t* table, int32_t kvh, int32_t p,
                              float scale) {
  const float* kp = kv.k + kv_offset(kv, table[p / kv.block_size], kvh) + p % kv.block_size;
  float dot = 0.0f;
  for (int32_t d = 0; d < kv.head_dim; ++d) dot += qh[d] * kp[int64_t{d} * kv.block_size];
  return dot * scale;
}

// The max and sum of one softmax row: query qi of sequence j, head h (blockIdx x, y, z).
__global__ void mass_rows_kernel(const float* q, int64_t q_stride, token_batch b, int32_t num_heads, paged_kv_layer kv,
                                 const mass_sequence* seqs, float* stats) {
  const int32_t h = blockIdx.x, qi = blockIdx.y, j = blockIdx.z;
  const mass_sequence s = seqs[j];
  if (qi >= s.num_queries) return;
  const int32_t t = s.first_token + qi, pos = b.positions[t];
  const int32_t kvh = h / (num_heads / kv.num_kv_heads);
  const uint32_t* table = b.tables + int64_t{b.token_seq[t]} * b.table_stride;
  const float* qh = q + int64_t{t} * q_stride + int64_t{h} * kv.head_dim;
  const float scale = rsqrtf(static_cast<float>(kv.head_dim));
  float m = -INFINITY;
  for (int32_t p = threadIdx.x; p <= pos; p += blockDim.x) m = fmaxf(m, score(qh, kv, table, kvh, p, scale));
  m = detail::block_max(m);
  float l = 0.0f;
  for (int32_t p = threadIdx.x; p <= pos; p += blockDim.x) l += expf(score(qh, kv, table, kvh, p, scale) - m);
  l = detail::block_sum(l);
  if (threadIdx.x == 0) {
    float* row = stats + ((int64_t{j} * attention_mass_max_queries + qi) * num_heads + h) * 2;
    row[0] = m;
    row[1] = l;
  }
}

// Slot p of sequence j (blockIdx.y): the weights its queries' heads give it, added in a
// fixed order (query, then head), to what the sums hold.
__global__ void mass_sums_kernel(const float* q, int64_t q_stride, token_batch b, int32_t num_heads, paged_kv_layer kv,
                                 const mass_sequence* seqs, const float* stats, float* mass) {
  const int32_t j = blockIdx.y;
  const mass_sequence s = seqs[j];
  const int32_t p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= s.seen) return;
  const float scale = rsqrtf(static_cast<float>(kv.head_dim));
  const int32_t group = num_heads / kv.num_kv_heads;
  float acc = 0.0f;
  for (int32_t qi = 0; qi < s.num_queries; ++qi) {
    const int32_t t = s.first_token + qi;
    if (p > b.positions[t]) continue;
    const uint32_t* table = b.tables + int64_t{b.token_seq[t]} * b.table_stride;
    for (int32_t h = 0; h < num_heads; ++h) {
      const float* row = stats + ((int64_t{j} * attention_mass_max_queries + qi) * num_heads + h) * 2;
      const float* qh = q + int64_t{t} * q_stride + int64_t{h} * kv.head_dim;
      acc += expf(score(qh, kv, table, h / group, p, scale) - row[0]) / row[1];
    }
  }
  mass[s.out + p] += acc;
}

// Move i's K and V (blockIdx.x) into workspace[i]: [K heads | V heads], K turned back.
__global__ void compact_gather_kernel(paged_kv_layer kv, const uint32_t* src, const slot_move* moves, const float* freqs,
                                      int32_t rot_dim, bool halves, float* workspace) {
  const int32_t i = blockIdx.x;
  const slot_move m = moves[i];
  const int32_t hd = kv.head_dim, row = kv.num_kv_heads * hd;
  float* k = workspace + int64_t{i} * 2 * row;
  float* v = k + row;
  const uint32_t block = src[m.from / kv.block_size];
  const int32_t slot = m.from % kv.block_size;
  for (int32_t x = threadIdx.x; x < row; x += blockDim.x) {
    const int32_t h = x / hd, d = x % hd;
    const int64_t base = kv_offset(kv, block, h);
    k[x] = kv.k[base + int64_t{d} * kv.block_size + slot];
    v[x] = kv.v[base + int64_t{slot} * hd + d];
  }
  if (!freqs || m.from == m.to) return;
  __syncthreads();
  const int32_t pairs = rot_dim / 2;
  for (int32_t x = threadIdx.x; x < kv.num_kv_heads * pairs; x += blockDim.x) {
    const int32_t h = x / pairs, pair = x % pairs;
    float sn, cs;
    sincosf(static_cast<float>(m.to - m.from) * freqs[pair], &sn, &cs);
    detail::rotate_pair(k + int64_t{h} * hd, pair, pairs, halves, cs, sn);
  }
}

// workspace[i] into move i's slot of dst.
__global__ void compact_scatter_kernel(paged_kv_layer kv, const uint32_t* dst, const slot_move* moves,
                                       const float* workspace) {
  const int32_t i = blockIdx.x;
  const slot_move m = moves[i];
  const int32_t hd = kv.head_dim, row = kv.num_kv_heads * hd;
  const float* k = workspace + int64_t{i} * 2 * row;
  const float* v = k + row;
  const uint32_t block = dst[m.to / kv.block_size];
  const int32_t slot = m.to % kv.block_size;
  for (int32_t x = threadIdx.x; x < row; x += blockDim.x) {
    const int32_t h = x / hd, d = x % hd;
    const int64_t base = kv_offset(kv, block, h);
    kv.k[base + int64_t{d} * kv.block_size + slot] = k[x];
    kv.v[base + int64_t{slot} * hd + d] = v[x];
  }
}

}  // namespace

size_t attention_mass_workspace(int32_t num_seqs, int32_t num_heads) {
  return static_cast<size_t>(num_seqs) * attention_mass_max_queries * num_heads * 2;
}

void attention_mass(const float* q, int64_t q_stride, const token_batch& b, int32_t num_heads, const paged_kv_layer& kv,
                    const mass_sequence* seqs, int32_t num_seqs, int32_t max_seen, float* workspace, float* mass,
                    cudaStream_t stream) {
  if (num_seqs == 0 || max_seen == 0) return;
  mass_rows_kernel<<<dim3(num_heads, attention_mass_max_queries, num_seqs), 128, 0, stream>>>(q, q_stride, b, num_heads,
                                                                                             kv, seqs, workspace);
  check_launch("attention_mass (rows)");
  constexpr int threads = 128;
  mass_sums_kernel<<<dim3((max_seen + threads - 1) / threads, num_seqs), threads, 0, stream>>>(q, q_stride, b, num_heads,
                                                                                             kv, seqs, workspace, mass);
  check_launch("attention_mass (sums)");
}

size_t kv_compact_workspace(int32_t num_moves, int32_t num_kv_heads, int32_t head_dim) {
  return static_cast<size_t>(num_moves) * 2 * num_kv_heads * head_dim;
}

void kv_compact(const paged_kv_layer& kv, const uint32_t* src, const uint32_t* dst, const slot_move* moves,
                int32_t num_moves, const float* freqs, int32_t rot_dim, rope_layout layout, float* workspace,
                cudaStream_t stream) {
  if (num_moves == 0) return;
  compact_gather_kernel<<<num_moves, 128, 0, stream>>>(kv, src, moves, freqs, rot_dim, layout == rope_layout::halves,
                                                       workspace);
  check_launch("kv_compact (gather)");
  compact_scatter_kernel<<<num_moves, 128, 0, stream>>>(kv, dst, moves, workspace);
  check_launch("kv_compact (scatter)");
}

}  // namespace troupe::cuda
