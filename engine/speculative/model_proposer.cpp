#include "engine/speculative/model_proposer.hpp"

#include <algorithm>


namespace troupe {

model_proposer::model_proposer(const model& draft, int32_t num_blocks, int32_t block_size, dtype kv_type,
                               thread_pool& pool)
    : model_(draft), own_kv_(true) {
  cache_ = std::make_unique<kv_cache>(
      transformer_shard::cache_shape(draft.config, shard_spec{}, num_blocks, block_size, kv_type));
  own_ = std::make_unique<transformer_shard>(draft, shard_spec{}, *cache_, pool, solo_);
  run_ = [this](const step_batch& b, float* h, float* l) { own_->forward(b, h, l); };
}

model_proposer::model_proposer(const model& target, int32_t exit_layer, int32_t num_blocks, int32_t block_size,
                               dtype kv_type, thread_pool& pool)
    : model_(target), own_kv_(true) {
  const shard_spec first{0, exit_layer, {}};
  cache_ = std::make_unique<kv_cache>(transformer_shard::cache_shape(target.config, first, num_blocks, block_size, kv_type));
  own_ = std::make_unique<transformer_shard>(target, first, *cache_, pool, solo_);
  run_ = [this, exit_layer](const step_batch& b, float* h, float* l) { own_->forward_early_exit(b, h, l, exit_layer); };
}

model_proposer::model_proposer(const model& target, transformer_shard& shard, int32_t exit_layer)
    : model_(target), own_kv_(false) {
  run_ = [&shard, exit_layer](const step_batch& b, float* h, float* l) { shard.forward_early_exit(b, h, l, exit_layer); };
}

void model_proposer::compacted(request_id id, const kv_compaction& c) {
  if (!own_kv_) return;  // (the target's moves are its own)
  const auto it = held_.find(id);
  if (it == held_.end()) return;
  own_->compact_kv(c);
  // What each slot holds now: the kept slots it had computed, in order, as far as they go.
  // Keys turned back to their slots (rotate) take the slot as their position. Slots of
  // blocks copied from shared ones are recomputed: the draft's keys in the shared block
  // may have been overwritten since the compaction was planned (it reaches a draft actor
  // with the request's next order).
  std::vector<held_slot>& held = it->second;
  const auto kept = static_cast<int32_t>(c.kept.size());
  int32_t valid = 0;
  while (valid < kept && c.kept[valid] < static_cast<int32_t>(held.size())) ++valid;
  if (!c.new_table.empty()) {
    const int32_t bs = cache_->shape().block_size;
    int32_t own_from = 0;  // the first slot in a block the compaction made the request's own
    while (own_from < kept && c.new_table[own_from / bs] == c.block_table[own_from / bs]) own_from += bs;
    valid = std::min(valid, own_from);
  }
  std::vector<held_slot> moved;
  moved.reserve(static_cast<size_t>(valid));
  for (int32_t i = 0; i < valid; ++i) moved.push_back({held[c.kept[i]].token, c.rotate ? i : held[c.kept[i]].rope});
  held = std::move(moved);
}

void model_proposer::layout_of(const draft_slot& s, std::vector<held_slot>& out) {
  const request& r = *s.req;
  const std::span<const int32_t> kept = s.slot_positions;
  const int32_t n = r.num_tokens();
  const int32_t after = kept.empty() ? 0 : kept.back() + 1;  // the first position past the kept ones
  out.clear();
  out.reserve(kept.size() + static_cast<size_t>(n - after));
  auto add = [&](int32_t pos) {
    const auto slot = static_cast<int32_t>(out.size());
    out.push_back({r.tokens[static_cast<size_t>(pos)], s.rope_in_cache ? slot : pos});
  };
  for (int32_t pos : kept) add(pos);
  for (int32_t pos = after; pos < n; ++pos) add(pos);
}

void model_proposer::catch_up(const draft_slot& s) {
  const request& r = *s.req;
  layout_of(s, layout_);
  const auto slots = static_cast<int32_t>(layout_.size());
  int32_t from = 0;
  if (own_kv_) {
    const auto& held = held_[r.id];
    from = static_cast<int32_t>(std::mismatch(held.begin(), held.end(), layout_.begin(), layout_.end()).first - held.begin());
  } else {
    // The target computed its tokens' KV (and the step's compactions are made).
    from = s.slot_positions.empty() ? r.num_computed_tokens : static_cast<int32_t>(s.slot_positions.size());
  }
  from = std::min(from, slots - 1);
  for (int32_t first = from; first < slots;) {
    int32_t end = first + 1;
    while (end < slots && layout_[end].rope == layout_[end - 1].rope + 1) ++end;
    run_tokens_.clear();
    for (int32_t i = first; i < end; ++i) run_tokens_.push_back(layout_[i].token);
    batch_.add(run_tokens_, first, r.blocks, end == slots ? 1 : 0);
    batch_.sequences.back().rope_pos = layout_[first].rope;
    first = end;
  }
}

void model_proposer::propose(std::span<draft_slot> slots) {
  const int32_t vocab = model_.config.vocab_size, dim = model_.config.dim;
  views_.clear();
  for (draft_slot& s : slots) {
    s.tokens.clear();
    s.q.clear();
    views_.push_back(s.req->smp);
  }
  // Round 0 feeds each request's tokens from where the draft's KV stops being right to its
  // last known token; round j > 0 feeds draft j - 1, in the slot after. Each round's last
  // logits give a draft.
  std::vector<int32_t> last_slot(slots.size()), last_rope(slots.size());
  for (int32_t round = 0;; ++round) {
    batch_.clear();
    std::vector<size_t> in;  // the slots this round drafts for
    for (size_t i = 0; i < slots.size(); ++i) {
      draft_slot& s = slots[i];
      if (static_cast<int32_t>(s.tokens.size()) >= s.max_tokens || static_cast<int32_t>(s.tokens.size()) < round) continue;
      if (round == 0) {
        catch_up(s);
        last_slot[i] = static_cast<int32_t>(layout_.size()) - 1;
        last_rope[i] = layout_.back().rope;
      } else {
        batch_.add(std::span<const int32_t>(s.tokens).subspan(round - 1, 1), last_slot[i] + round, s.req->blocks, 1);
        batch_.sequences.back().rope_pos = last_rope[i] + round;
      }
      in.push_back(i);
    }
    if (in.empty()) break;
    hidden_.resize(static_cast<size_t>(batch_.num_tokens()) * dim);
    logits_.resize(in.size() * static_cast<size_t>(vocab));
    run_(batch_, hidden_.data(), logits_.data());
    for (size_t row = 0; row < in.size(); ++row) {
      draft_slot& s = slots[in[row]];
      draft_next(s, views_[in[row]], logits_.data() + row * vocab, vocab, greedy_);
    }
  }
  if (!own_kv_) return;
  // The draft's cache now holds each request's known tokens and every draft but the last.
  for (size_t i = 0; i < slots.size(); ++i) {
    const draft_slot& s = slots[i];
    if (s.tokens.empty()) continue;
    auto& held = held_[s.req->id];
    layout_of(s, held);
    for (size_t j = 0; j + 1 < s.tokens.size(); ++j)
      held.push_back({s.tokens[j], last_rope[i] + static_cast<int32_t>(j) + 1});
  }
}

}  // namespace troupe
