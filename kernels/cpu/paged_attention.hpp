// paged_attention: causal grouped-query attention of a step's tokens over K/V held in
// fixed-size blocks.
//
// One layer's cache (the caller owns the memory; a shard holds one per layer):
//   k: [num_blocks][num_kv_heads][head_dim][block_size] (dimension-major in a block, so
//      that the scores of 16 slots are 16 lanes of one vector)
//   v: [num_blocks][num_kv_heads][block_size][head_dim]
// in F32, or in F16 (half the memory traffic of long contexts; values rounded to nearest
// even when written, widened exactly when read), or in int8 with one float scale per slot
// and KV head for K and for V (k_scale, v_scale: [num_blocks][num_kv_heads][block_size];
// a quarter of F32's traffic and memory, plus the scales): each token's head vector is
// quantized symmetrically when written (scale = max |x| / 127, q = x / scale rounded to
// nearest even), a score is (q . k_int8) * k_scale / sqrt(head_dim), and a value row
// enters the weighted sum as (weight * v_scale) * v_int8.
// Position p of a sequence lives in block block_table[p / block_size], slot
// p % block_size. Each token of the step attends to positions first..position of its own
// sequence, which must already be written (its own K/V included); the positions before
// first weigh exactly zero.
//
//   q:   [num_tokens][q_stride], the first num_heads * head_dim used
//   out: [num_tokens][out_stride], num_heads * head_dim written
// Query head h reads KV head h / (num_heads / num_kv_heads).
//
// Every (token, head) result is computed in a fixed order from that token's query and
// its own sequence's cache only, so batching never changes it.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

struct paged_kv_layer {
  float* k = nullptr;  // [num_blocks][num_kv_heads][head_dim][block_size]
  float* v = nullptr;  // [num_blocks][num_kv_heads][block_size][head_dim]
  int32_t num_blocks = 0;
  int32_t num_kv_heads = 0;
  int32_t block_size = 0;
  int32_t head_dim = 0;
  uint16_t* k16 = nullptr;  // F16 storage instead of k and v, when set (CPU kernels)
  uint16_t* v16 = nullptr;
  int8_t* k8 = nullptr;  // int8 storage instead of k and v, when set (CPU kernels), with
  int8_t* v8 = nullptr;  // its scales
  float* k_scale = nullptr;
  float* v_scale = nullptr;

  // Start of one KV head's part of a block, in k or v (the same offset in both).
  int64_t offset(uint32_t block, int32_t kv_head) const {
    return (int64_t{block} * num_kv_heads + kv_head) * block_size * head_dim;
  }
  // Start of one KV head's scales in a block, in k_scale or v_scale.
  int64_t scale_offset(uint32_t block, int32_t kv_head) const {
    return (int64_t{block} * num_kv_heads + kv_head) * block_size;
  }
};

struct attention_token {
  int32_t position;             // this token's position in its sequence
  const uint32_t* block_table;  // its sequence's blocks, covering 0..position
  int32_t first = 0;            // the first position it attends to (a sliding window's start), 0..position
  float* weights = nullptr;     // when set, query head h's softmax weights go to
  int64_t weights_stride = 0;   // weights[h * weights_stride + p], p in 0..position (those
                                // before first exactly 0): what KV eviction policies read
  // A token tree (speculative decoding verifies one in a pass): positions tree_first ..
  // position hold the tree's nodes, and this token sees only those whose bit
  // (p - tree_first) of tree_mask is set (its ancestors and itself); the positions
  // before tree_first as usual. tree_first -1: no tree.
  int32_t tree_first = -1;
  uint64_t tree_mask = 0;
};
inline constexpr int32_t max_tree_tokens = 64;  // a tree's nodes, its root included

void paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride,
                     const attention_token* tokens, int32_t num_tokens, int32_t num_heads,
                     const paged_kv_layer& kv, thread_pool& pool);

// Writes one token's K and V rows ([num_kv_heads][head_dim] each) at its position.
void paged_kv_write(const paged_kv_layer& kv, const uint32_t* block_table, int32_t position,
                    const float* k, const float* v);
// Reads them back, as the attention reads them (F16 widened, int8 scaled).
void paged_kv_read(const paged_kv_layer& kv, const uint32_t* block_table, int32_t position, float* k, float* v);
// Copies the slot at position `from` to position `to` (of the same or another table), as
// stored: the same bits in every storage type.
void paged_kv_copy(const paged_kv_layer& kv, const uint32_t* from_table, int32_t from, const uint32_t* to_table,
                   int32_t to);

}  // namespace troupe
