// cuda_shard_eviction: KV eviction's part of the GPU shard (cuda_transformer_shard.cpp):
// the attention sums a step's sequences ask for (staged before the layers, added to after
// each layer's attention, summed over the tensor-parallel group and brought back after
// them) and the compactions before a step, over the shard's stream. Built with the CUDA
// kernels only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/forward/nccl_group.hpp"
#include "engine/forward/step_batch.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/kv_eviction.hpp"

namespace troupe {

class cuda_shard_eviction {
 public:
  // The cache's geometry: blocks, their size, the longest block table; this rank's heads.
  cuda_shard_eviction(int32_t num_blocks, int32_t block_size, int32_t max_table, int32_t heads, int32_t kv_heads,
                      int32_t head_dim)
      : num_blocks_(num_blocks), block_size_(block_size), max_table_(max_table), heads_(heads), kv_heads_(kv_heads),
        head_dim_(head_dim) {}

  // Stages the sums `batch`'s sequences ask for, zeroed on `stream`; how many (0: none).
  int64_t stage(const step_batch& batch, cudaStream_t stream);
  // After a layer's attention (q as the attention read it): its weights added to the sums.
  void add_layer(const float* q, int64_t q_stride, const cuda::token_batch& tb, const paged_kv_layer& cache,
                 cudaStream_t stream);
  // After the layers: the sums over the tensor-parallel group (tp may be null), copied
  // back. The copy ends before the stream's next work does.
  void fetch(gpu_collective* tp, cudaStream_t stream);
  // Once the stream has run past fetch(): each sequence's sums added to what it holds.
  void add_to(const step_batch& batch) const;

  // Moves the slots `c` keeps in every layer of `caches`; keys turn back with freqs (a
  // device array of rot_dim / 2 frequencies) where c.rotate says.
  void compact(const kv_compaction& c, std::span<const paged_kv_layer> caches, const float* freqs, int32_t rot_dim,
               rope_layout layout, cudaStream_t stream);

 private:
  int32_t num_blocks_, block_size_, max_table_, heads_, kv_heads_, head_dim_;
  std::vector<cuda::mass_sequence> seqs_;
  int32_t max_seen_ = 0;
  int64_t values_ = 0;
  cuda::buffer<cuda::mass_sequence> seq_buffer_;
  cuda::buffer<float> mass_, stats_, compact_workspace_;
  std::vector<float> staging_;
  std::vector<cuda::slot_move> moves_;
  std::vector<uint32_t> compact_staging_;
  cuda::buffer<uint32_t> compact_inputs_;
};

}  // namespace troupe
