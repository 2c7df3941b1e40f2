#include "engine/serve/llm_engine.hpp"

#include "engine/forward/cuda_shard.hpp"
#include "engine/forward/kv_cache_type.hpp"
#include "engine/serve/step_choices.hpp"
#include "engine/speculative/eagle_proposer.hpp"
#include "engine/speculative/medusa_proposer.hpp"
#include "engine/speculative/model_proposer.hpp"
#include "engine/speculative/ngram_proposer.hpp"

#include <algorithm>
#include <stdexcept>

namespace troupe {

engine_config llm_engine::complete(engine_config cfg, const model& m) {
  if (cfg.sched.context == 0) cfg.sched.context = m.config.max_seq_len;
  if (cfg.sched.vocab == 0) cfg.sched.vocab = m.config.vocab_size;
  if (cfg.sched.no_eviction.empty()) cfg.sched.no_eviction = why_no_eviction(m, cfg.spec).value_or("");
  if (cfg.sched.tier_blocks == 0 && !cfg.sched.kv.tiers.empty())
    cfg.sched.tier_blocks = tier_directory_blocks(cfg.sched.kv, m.config, cfg.kv_type.value_or(kv_cache_type_for(m)));
  cfg.sched.tier_prefetch = cfg.sched.kv.tiers.size() > 1;
  return cfg;
}

std::optional<std::string> llm_engine::why_no_eviction(const model& m, const speculative_config& s) {
  if (s.method == spec_method::draft || s.method == spec_method::early_exit)
    return "KV eviction works with n-gram speculation only (a draft's cache would not follow the evictions)";
  if (m.config.sliding_window > 0) return "KV eviction needs a model without a sliding window";
  if (!s.tree.empty()) return "token trees and KV eviction do not run together";
  return std::nullopt;
}

status llm_engine::check(const model& m, const engine_config& cfg) {
  const speculative_config& s = cfg.spec;
  if (auto e = validate(s, m.config)) return error{*e};
  const kv_eviction_config& ev = cfg.sched.eviction;
  if (auto e = validate(ev)) return error{*e};
  if (ev.enabled()) {
    if (auto why = why_no_eviction(m, s)) return error{*why};
    if (ev.budget > m.config.max_seq_len)
      return error{"a KV budget of " + std::to_string(ev.budget) + " tokens is past the model's context of " +
                   std::to_string(m.config.max_seq_len)};
  }
  for (const tier_config& t : cfg.sched.kv.tiers)
    if (auto e = validate(t)) return error{*e};
  if (!s.tree.empty() && !cfg.sched.kv.tiers.empty()) return error{"token trees and KV tiers do not run together"};
  if (s.method == spec_method::draft) {
    if (cfg.draft == nullptr) return error{"speculative method draft needs a draft model"};
    if (auto e = check_draft(*cfg.draft, m)) return error{*e};
  }
  if (s.uses_heads()) {
    if (cfg.heads == nullptr) return error{"speculative method " + std::string(spec_method_name(s.method)) + " needs a head file"};
    if (auto e = check_heads(s, *cfg.heads)) return error{*e};
  }
  return ok();
}

// (With a shard made elsewhere, the pool is not used: one thread.)
llm_engine::llm_engine(const model& m, const tokenizer& tok, engine_config cfg, std::unique_ptr<forward_shard> shard)
    : model_(m), cfg_(complete(cfg, m)), sched_(cfg_.sched, tok), pool_(1), shard_(std::move(shard)) {
  TROUPE_ASSERT(shard_ && shard_->is_first_stage() && shard_->is_last_stage(), "the shard runs every layer");
  start_speculation(dynamic_cast<transformer_shard*>(shard_.get()));
}

void llm_engine::start_speculation(transformer_shard* cpu_shard) {
  if (auto st = check(model_, cfg_); !st) throw std::invalid_argument(st.err().message);
  const speculative_config& s = cfg_.spec;
  trees_.emplace(s, cfg_.heads && s.method == spec_method::medusa ? cfg_.heads->depth() : max_draft_tokens);
  switch (s.method) {
    case spec_method::none: break;
    case spec_method::ngram: proposer_ = std::make_unique<ngram_proposer>(s.ngram_min, s.ngram_max); break;
    case spec_method::early_exit:
      if (cpu_shard == nullptr) throw std::invalid_argument("early exit runs on a CPU shard only");
      proposer_ = std::make_unique<model_proposer>(model_, *cpu_shard, s.exit_layer_for(model_.config.num_layers));
      break;
    case spec_method::medusa: proposer_ = std::make_unique<medusa_proposer>(model_, *cfg_.heads, pool_); break;
    case spec_method::eagle: proposer_ = std::make_unique<eagle_proposer>(model_, *cfg_.heads, pool_); break;
    case spec_method::draft:
      if (cpu_shard == nullptr) throw std::invalid_argument("a draft model runs beside a CPU shard only");
      proposer_ = std::make_unique<model_proposer>(*cfg_.draft, static_cast<int32_t>(cfg_.sched.kv.num_blocks),
                                                   cfg_.sched.kv.block_size,
                                                   cfg_.kv_type.value_or(kv_cache_type_for(*cfg_.draft)), pool_);
      break;
  }
}

llm_engine::llm_engine(const model& m, const tokenizer& tok, engine_config cfg)
    : model_(m), cfg_(complete(cfg, m)), sched_(cfg_.sched, tok), pool_(cfg_.num_threads) {
  cache_ = std::make_unique<kv_cache>(transformer_shard::cache_shape(
      m.config, shard_spec{}, static_cast<int32_t>(cfg_.sched.kv.num_blocks), cfg_.sched.kv.block_size,
      cfg_.kv_type.value_or(kv_cache_type_for(m))));
  auto shard = std::make_unique<transformer_shard>(m, shard_spec{}, *cache_, pool_, solo_);
  transformer_shard* cpu = shard.get();
  if (!cfg_.sched.kv.tiers.empty()) {
    auto t = shard_tiers::open(cfg_.sched.kv.tiers, m, shard_spec{}, *cache_);
    if (!t) throw std::invalid_argument(t.err().message);
    tiers_ = std::move(t).value();
    sched_.set_tier_probe([this](std::span<const tier_key> keys) { return tiers_->probe(keys); });
  }
  shard_ = std::move(shard);
  start_speculation(cpu);
}

expected<std::unique_ptr<llm_engine>> llm_engine::on_gpu(const model& m, const tokenizer& tok, engine_config cfg,
                                                         gpu_placement where) {
  if (cfg.kv_type) return error{"a KV cache type applies to the CPU; a GPU shard keeps its cache in its own type"};
  if (!cfg.sched.kv.tiers.empty()) return error{"KV tiers serve CPU shards; a GPU shard's cache stays on its device"};
  if (cfg.spec.method == spec_method::draft || cfg.spec.method == spec_method::early_exit || cfg.spec.uses_heads())
    return error{"on a GPU, speculative decoding proposes by n-gram only"};
  if (!cfg.spec.tree.empty()) return error{"on a GPU, speculative decoding verifies chains, not token trees"};
  if (auto st = check(m, cfg); !st) return st.err();
  cfg = complete(cfg, m);
  cuda_shard_options o;
  o.device = where.device;
  o.weights = where.weights;
  o.num_blocks = static_cast<int32_t>(cfg.sched.kv.num_blocks);
  o.block_size = cfg.sched.kv.block_size;
  o.max_step_tokens = cfg.sched.max_step_tokens;
  auto shard = make_cuda_shard(m, shard_spec{}, o);
  if (!shard) return shard.err();
  return std::unique_ptr<llm_engine>(new llm_engine(m, tok, cfg, std::move(*shard)));
}

status llm_engine::add_request(request_id id, request_params params) {
  return sched_.add(id, std::move(params));
}

std::optional<step_output> llm_engine::abort(request_id id) {
  if (proposer_) proposer_->forget(id);
  return sched_.abort(id);
}

std::vector<step_output> llm_engine::step() {
  const speculative_config& live = trees_->next_step();
  if (proposer_) plan_drafts(sched_.running(), live, cfg_.sched.context);
  step_plan plan = sched_.schedule();
  stats_.preemptions += plan.preempted.size();
  if (proposer_) {
    for (request_id id : plan.preempted) proposer_->forget(id);
    fill_drafts(plan, sched_, *proposer_, slots_, live.tree);
  }
  step_tokens got;
  batch_.clear();
  // KV tiers: the loads first; a request one of whose blocks no tier held goes back to
  // compute before anything is sampled for it.
  std::vector<request_id> failed;
  if (tiers_) tiers_->prefetch(plan.tier_prefetch);
  if (tiers_ && !plan.tier_loads.empty()) failed = tiers_->load(plan.tier_loads);
  sched_.settle_tier_loads(plan, failed);
  if (proposer_)
    for (request_id id : failed) proposer_->forget(id);
  for (const auto& c : plan.compactions) batch_.compactions.push_back({c.block_table, c.kept, c.rotate, c.new_table});
  stats_.evicted_tokens = sched_.evicted_tokens();
  mass_.assign(static_cast<size_t>(plan.attention_sums()), 0.0f);
  float* mass = mass_.data();
  if (!plan.chunks.empty()) {
    tree_parents_.resize(plan.chunks.size());
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const scheduled_chunk& c = plan.chunks[i];
      const request* r = sched_.find(c.id);
      if (c.num_draft > 0) {
        tokens_.assign(c.tokens.begin(), c.tokens.end());
        tokens_.insert(tokens_.end(), c.draft.begin(), c.draft.end());
        batch_.add(tokens_, c.first_slot(), c.block_table, 1 + c.num_draft);
        if (!c.draft_parents.empty()) {  // a token tree: its root, then its nodes
          tree_parents_of(c.draft_parents, tree_parents_[i]);
          batch_.sequences.back().tree_parents = tree_parents_[i].data();
        }
      } else {
        batch_.add(c.tokens, c.first_slot(), c.block_table, c.sample ? 1 : 0);
      }
      batch_.sequences.back().rope_pos = c.first_rope_position();
      if (c.attention) {
        batch_.sequences.back().attention_mass = mass;
        mass += c.slots_seen();
      }
      if (r && c.first < r->num_prompt_tokens)
        stats_.prompt_tokens_computed += std::min(c.count, r->num_prompt_tokens - c.first);
    }
    const int32_t vocab = model_.config.vocab_size;
    hidden_.resize(static_cast<size_t>(batch_.num_tokens()) * model_.config.dim);
    ++stats_.steps;
    stats_.tokens_computed += batch_.num_tokens();
    // Who chooses the tokens (step_choices.hpp): the shard where its logits are, when
    // every row allows it and the shard does (a CPU shard declines: its logits are
    // already here); else each sampler from its row, or verifying its drafts.
    const std::vector<token_choice> choices = shard_choices(plan, sched_);
    chosen_.assign(choices.size(), 0);
    if (!choices.empty() && shard_->forward_choose(batch_, hidden_.data(), choices.data(), chosen_.data())) {
      got = replay_chosen(plan, sched_, chosen_, cfg_.spec);
    } else {
      logits_.resize(static_cast<size_t>(batch_.num_logits()) * vocab);
      shard_->forward(batch_, hidden_.data(), logits_.data());
      got = sample_rows(plan, sched_, logits_.data(), vocab, cfg_.spec);
      // Each verified tree's accepted path moves down in its KV to follow the root.
      trees_->keep(plan, sched_, got.paths, [this](const scheduled_chunk& c, std::span<const int32_t> kept) {
        const bool moved = shard_->compact_kv({c.block_table, kept, false, {}});
        TROUPE_ASSERT(moved, "a shard that verified a tree moves its KV");
      });
      // (Heads that read features run on CPU shards, whose forward() leaves them here.)
      if (proposer_)
        observe_features(plan, sched_, got.emitted, got.paths, hidden_.data(), model_.config.dim, *proposer_);
    }
    if (tiers_) tiers_->save(plan.tier_saves, failed);
    stats_.spec += got.spec;
  }
  std::vector<step_output> outs = sched_.update_from_output(plan, got.samples, got.emitted);
  sched_.observe_attention(plan, mass_, model_.config.num_heads * model_.config.num_layers);
  if (proposer_)
    for (const step_output& o : outs)
      if (o.finished) proposer_->forget(o.id);
  return outs;
}

}  // namespace troupe
