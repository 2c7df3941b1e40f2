// Prefill attention on the device, flash-attention style, over the paged cache of
// kernels/cuda/paged_attention.hpp: out[t][h] = softmax(q[t][h] . K / sqrt(head_dim)) V
// over positions 0..positions[t], causal, grouped-query. CPU reference: paged_attention in
// kernels/cpu/paged_attention.hpp (the same meaning).
//
// A block takes a tile of up to prefill_tile_rows consecutive tokens of one sequence (at
// consecutive positions) and one head: it walks the sequence's KV blocks once, each block
// staged in shared memory and used by every row of the tile, with the softmax kept online
// (running max and sum, the accumulator rescaled as the max grows). The split kernel
// (paged_attention) reads a block once per token instead; this one serves prompt chunks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_attention.hpp"

namespace troupe::cuda {

inline constexpr int32_t prefill_tile_rows = 16;

// rows tokens first_token.. of one sequence, at consecutive positions.
struct query_tile {
  int32_t first_token = 0;
  int32_t rows = 0;
};

// tiles: num_tiles entries in device memory covering the tokens to compute. The cache's
// block_size must be at most 32 and head_dim at most 256.
void prefill_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride, const token_batch& b,
                       const query_tile* tiles, int32_t num_tiles, int32_t num_heads, const paged_kv_layer& kv,
                       cudaStream_t stream);

}  // namespace troupe::cuda
