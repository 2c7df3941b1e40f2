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

void model_proposer::propose(std::span<draft_slot> slots) {
  const int32_t vocab = model_.config.vocab_size, dim = model_.config.dim;
  views_.clear();
  for (draft_slot& s : slots) {
    s.tokens.clear();
    s.q.clear();
    views_.push_back(s.req->smp);
  }
  // Round 0 feeds each request's tokens from where the draft's KV stops being right to its
  // last known token; round j > 0 feeds draft j - 1. Each round's last logits give a draft.
  for (int32_t round = 0;; ++round) {
    batch_.clear();
    std::vector<size_t> in;  // the slots this round drafts for
    for (size_t i = 0; i < slots.size(); ++i) {
      draft_slot& s = slots[i];
      const request& r = *s.req;
      if (static_cast<int32_t>(s.tokens.size()) >= s.max_tokens || static_cast<int32_t>(s.tokens.size()) < round) continue;
      const int32_t n = r.num_tokens();
      if (round == 0) {
        int32_t from = r.num_computed_tokens;
        if (own_kv_) {
          const auto& held = held_[r.id];
          const auto diff = std::mismatch(held.begin(), held.end(), r.tokens.begin(), r.tokens.end());
          from = static_cast<int32_t>(diff.first - held.begin());
        }
        from = std::min(from, n - 1);
        batch_.add(std::span<const int32_t>(r.tokens).subspan(from), from, r.blocks, 1);
      } else {
        batch_.add(std::span<const int32_t>(s.tokens).subspan(round - 1, 1), n + round - 1, r.blocks, 1);
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
  for (draft_slot& s : slots) {
    const request& r = *s.req;
    if (s.tokens.empty()) continue;
    auto& held = held_[r.id];
    held.assign(r.tokens.begin(), r.tokens.end());
    held.insert(held.end(), s.tokens.begin(), s.tokens.end() - 1);
  }
}

}  // namespace troupe
