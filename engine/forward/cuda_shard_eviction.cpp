#include "engine/forward/cuda_shard_eviction.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/common/assert.hpp"

namespace troupe {

int64_t cuda_shard_eviction::stage(const step_batch& batch, cudaStream_t stream) {
  seqs_.clear();
  values_ = 0;
  if (!batch.wants_attention()) return 0;
  int32_t t = 0, out = 0;
  max_seen_ = 0;
  for (const auto& sq : batch.sequences) {
    if (sq.attention_mass) {
      static_assert(attention_mass_queries == cuda::attention_mass_max_queries);
      const int32_t rows = attention_mass_rows(sq.num_tokens), seen = sq.start_pos + sq.num_tokens;
      seqs_.push_back({t + sq.num_tokens - rows, rows, seen, out});
      out += seen;
      max_seen_ = std::max(max_seen_, seen);
    }
    t += sq.num_tokens;
  }
  const auto seqs = static_cast<int32_t>(seqs_.size());
  if (seq_buffer_.size() < seqs_.size()) seq_buffer_ = cuda::buffer<cuda::mass_sequence>(seqs_.size());
  if (mass_.size() < static_cast<size_t>(out)) mass_ = cuda::buffer<float>(static_cast<size_t>(out));
  if (stats_.size() < cuda::attention_mass_workspace(seqs, heads_))
    stats_ = cuda::buffer<float>(cuda::attention_mass_workspace(seqs, heads_));
  staging_.resize(static_cast<size_t>(out));
  cuda::check(cudaMemcpyAsync(seq_buffer_.get(), seqs_.data(), sizeof(cuda::mass_sequence) * seqs_.size(),
                              cudaMemcpyHostToDevice, stream),
              "copy to the device");
  cuda::check(cudaMemsetAsync(mass_.get(), 0, sizeof(float) * static_cast<size_t>(out), stream), "cudaMemsetAsync");
  values_ = out;
  return values_;
}

void cuda_shard_eviction::add_layer(const float* q, int64_t q_stride, const cuda::token_batch& tb,
                                    const paged_kv_layer& cache, cudaStream_t stream) {
  if (seqs_.empty()) return;
  cuda::attention_mass(q, q_stride, tb, heads_, cache, seq_buffer_.get(), static_cast<int32_t>(seqs_.size()), max_seen_,
                       stats_.get(), mass_.get(), stream);
}

void cuda_shard_eviction::fetch(gpu_collective* tp, cudaStream_t stream) {
  if (values_ == 0) return;
  // Every shard of a stage summed its own heads: the stage's sums after this.
  if (tp) tp->all_reduce_sum(mass_.get(), values_, stream);
  cuda::check(cudaMemcpyAsync(staging_.data(), mass_.get(), sizeof(float) * static_cast<size_t>(values_),
                              cudaMemcpyDeviceToHost, stream),
              "copy to the host");
}

void cuda_shard_eviction::add_to(const step_batch& batch) const {
  if (values_ == 0) return;
  size_t j = 0;
  for (const auto& sq : batch.sequences) {
    if (!sq.attention_mass) continue;
    const cuda::mass_sequence& m = seqs_[j++];
    for (int32_t p = 0; p < m.seen; ++p) sq.attention_mass[p] += staging_[static_cast<size_t>(m.out + p)];
  }
}

// The kept slots move down (into the new table where blocks were replaced by copies);
// each slot that changes place moves once.
void cuda_shard_eviction::compact(const kv_compaction& c, std::span<const paged_kv_layer> caches, const float* freqs,
                                  int32_t rot_dim, rope_layout layout, cudaStream_t stream) {
  const int32_t bs = block_size_;
  auto fits = [&](std::span<const block_id> t) {
    for (block_id b : t) TROUPE_ASSERT(b.value < static_cast<uint32_t>(num_blocks_), b.value, num_blocks_);
    return static_cast<int32_t>(t.size()) <= max_table_;
  };
  const std::span<const block_id> to_table = c.target();
  TROUPE_ASSERT(fits(c.block_table) && fits(to_table), c.block_table.size(), to_table.size());
  TROUPE_ASSERT(static_cast<int64_t>(to_table.size()) * bs >= static_cast<int64_t>(c.kept.size()), to_table.size());
  moves_.clear();
  for (size_t i = 0; i < c.kept.size(); ++i) {
    const int32_t from = c.kept[i], to = static_cast<int32_t>(i);
    TROUPE_ASSERT(from >= to && from < static_cast<int64_t>(c.block_table.size()) * bs && (i == 0 || from > c.kept[i - 1]),
                  i, from);
    if (!c.stays(i, bs)) moves_.push_back({from, to});
  }
  if (moves_.empty()) return;
  // The two tables and the moves, in one copy.
  compact_staging_.assign(2 * static_cast<size_t>(max_table_) + 2 * moves_.size(), 0u);
  for (size_t b = 0; b < c.block_table.size(); ++b) compact_staging_[b] = c.block_table[b].value;
  for (size_t b = 0; b < to_table.size(); ++b) compact_staging_[max_table_ + b] = to_table[b].value;
  std::memcpy(compact_staging_.data() + 2 * max_table_, moves_.data(), sizeof(cuda::slot_move) * moves_.size());
  if (compact_inputs_.size() < compact_staging_.size()) compact_inputs_ = cuda::buffer<uint32_t>(compact_staging_.size());
  cuda::check(cudaMemcpyAsync(compact_inputs_.get(), compact_staging_.data(), sizeof(uint32_t) * compact_staging_.size(),
                              cudaMemcpyHostToDevice, stream),
              "copy to the device");
  const size_t ws = cuda::kv_compact_workspace(static_cast<int32_t>(moves_.size()), kv_heads_, head_dim_);
  if (compact_workspace_.size() < ws) compact_workspace_ = cuda::buffer<float>(ws);
  const uint32_t* src = compact_inputs_.get();
  const auto* moves = reinterpret_cast<const cuda::slot_move*>(src + 2 * max_table_);
  for (const paged_kv_layer& cache : caches)
    cuda::kv_compact(cache, src, src + max_table_, moves, static_cast<int32_t>(moves_.size()), c.rotate ? freqs : nullptr,
                     rot_dim, layout, compact_workspace_.get(), stream);
}

}  // namespace troupe
