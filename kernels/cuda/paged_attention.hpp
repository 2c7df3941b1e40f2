// Paged attention on the device, over the same cache layout as the CPU's
// (kernels/cpu/paged_attention.hpp: per block and KV head, K dimension-major and V
// slot-major), so a KV block holds the same bytes on either side and can move between
// them as it is.
//
// The tokens of a step, each with its position and its sequence's block table:
//   positions[t], token_seq[t] (the row of tables that is t's), tables[seq][table_stride].
// All device pointers.
//
// paged_attention splits every (token, head) over the sequence in chunks of `split`
// positions, computes each chunk's softmax partials (max, sum, weighted V) in parallel,
// and merges them exactly (log-sum-exp), so a long context keeps the whole device busy
// even for one token. It serves decode tokens and prefill chunks alike (each query attends
// to positions 0..its own).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/rope.hpp"

#include "kernels/cpu/paged_attention.hpp"

namespace troupe::cuda {

struct token_batch {
  const int32_t* positions = nullptr;  // [num_tokens]
  const int32_t* token_seq = nullptr;  // [num_tokens]
  const uint32_t* tables = nullptr;    // [num_seqs][table_stride]
  int32_t table_stride = 0;
  int32_t num_tokens = 0;
  // Token trees (paged_attention only; attention_token's tree_first and tree_mask, per
  // token): null for none.
  const int32_t* tree_first = nullptr;  // [num_tokens], -1 for a token of no tree
  const uint64_t* tree_mask = nullptr;  // [num_tokens]
};

// Writes each token's K and V rows (k, v: [num_tokens][stride], num_kv_heads * head_dim
// used) at its position. kv's k and v are device pointers.
void paged_kv_write(const paged_kv_layer& kv, const float* k, const float* v, int64_t stride, const token_batch& b,
                    cudaStream_t stream);

// rope() over the Q and K heads of each token's row of qkv ([num_tokens][stride]: Q's
// num_heads heads, K's num_kv_heads, then V's, head_dim each), in place, then
// paged_kv_write of its K and V: the two in one launch (the step's positions come from b).
void rope_kv_write(const paged_kv_layer& kv, float* qkv, int64_t stride, int32_t num_heads, int32_t rot_dim,
                   const float* cos_table, const float* sin_table, rope_layout layout, const token_batch& b,
                   cudaStream_t stream);

// The partials per (token, head) for positions up to max_position: the launch shape, the
// only thing about a step's positions that the launches themselves depend on.
int32_t paged_attention_splits(int32_t max_position, int32_t split);

// Floats of workspace paged_attention needs; max_position bounds every positions[t].
size_t paged_attention_workspace(int32_t num_tokens, int32_t num_heads, int32_t head_dim, int32_t max_position,
                                 int32_t split);

// out[t][h] = softmax(q[t][h] . K / sqrt(head_dim)) V over positions 0..positions[t]
// (those of a token tree that are not the token's ancestors masked, where b has trees).
// split: positions per partial (a multiple of 32, at most 1024).
void paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride, const token_batch& b,
                     int32_t num_heads, int32_t max_position, const paged_kv_layer& kv, float* workspace, int32_t split,
                     cudaStream_t stream);

}  // namespace troupe::cuda
