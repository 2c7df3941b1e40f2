// KV eviction on the device (engine/kv/kv_eviction.hpp): the attention each cache slot
// receives, and the compaction that keeps some slots of a sequence, over the cache layout
// of paged_attention.hpp. The CPU's references: attention_token.weights summed as
// transformer_shard does, and transformer_shard::compact.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/paged_attention.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cuda/paged_attention.hpp"

namespace troupe::cuda {

// A sequence whose attention a step sums: its queries are the step's tokens first_token ..
// first_token + num_queries - 1 (at most attention_mass_max_queries), and its sums the
// floats mass[out .. out + seen - 1], one per slot its last query sees.
struct mass_sequence {
  int32_t first_token = 0;
  int32_t num_queries = 0;
  int32_t seen = 0;
  int32_t out = 0;
};
inline constexpr int32_t attention_mass_max_queries = 32;

// Floats of workspace attention_mass needs for num_seqs sequences of num_heads heads.
size_t attention_mass_workspace(int32_t num_seqs, int32_t num_heads);

// Adds to mass, for each sequence of seqs (a device array of num_seqs) and each slot p,
// the softmax weight p gets from each of its queries' heads: exp(q.k_p / sqrt(head_dim) - M)
// / L, with M and L the row's max and sum (computed first, into workspace). q as
// paged_attention takes it (after RoPE); max_seen bounds every seqs[j].seen.
void attention_mass(const float* q, int64_t q_stride, const token_batch& b, int32_t num_heads, const paged_kv_layer& kv,
                    const mass_sequence* seqs, int32_t num_seqs, int32_t max_seen, float* workspace, float* mass,
                    cudaStream_t stream);

// A compaction's moves: slot from (in table src) to slot to (in table dst), as many as
// num_moves, in a device array; each from >= to.
struct slot_move {
  int32_t from = 0;
  int32_t to = 0;
};

// Floats of workspace kv_compact needs for num_moves moves.
size_t kv_compact_workspace(int32_t num_moves, int32_t num_kv_heads, int32_t head_dim);

// Moves every slot of moves at once (gathered into workspace, then written: a slot read is
// never one written before it is read). With freqs (rot_dim / 2 RoPE frequencies, a device
// array), each key turns back by from - to positions in `layout`: StreamingLLM's positions
// in the cache.
void kv_compact(const paged_kv_layer& kv, const uint32_t* src, const uint32_t* dst, const slot_move* moves,
                int32_t num_moves, const float* freqs, int32_t rot_dim, rope_layout layout, float* workspace,
                cudaStream_t stream);

}  // namespace troupe::cuda
