#include "engine/serve/llm_engine.hpp"

#include "engine/forward/cuda_shard.hpp"
#include "engine/forward/kv_cache_type.hpp"
#include "engine/serve/step_choices.hpp"
#include "engine/speculative/model_proposer.hpp"

#include <algorithm>
#include <stdexcept>

namespace troupe {

engine_config llm_engine::complete(engine_config cfg, const model& m) {
  if (cfg.sched.context == 0) cfg.sched.context = m.config.max_seq_len;
  cfg.sched.sliding_window = m.config.sliding_window;
  if (cfg.sched.vocab == 0) cfg.sched.vocab = m.config.vocab_size;
  if (cfg.sched.no_eviction.empty()) cfg.sched.no_eviction = why_no_eviction(cfg.spec).value_or("");
  if (cfg.sched.tier_blocks == 0 && !cfg.sched.kv.tiers.empty())
    cfg.sched.tier_blocks = tier_directory_blocks(cfg.sched.kv, m.config, cfg.kv_type.value_or(kv_cache_type_for(m)));
  cfg.sched.tier_prefetch = cfg.sched.kv.tiers.size() > 1;
  return cfg;
}

std::optional<std::string> llm_engine::why_no_eviction(const speculative_config& s) {
  if (!s.tree.empty())
    return "token trees and KV eviction do not run together (yet): a tree's kept path and a compaction both "
           "move the request's slots, and the two moves are not composed";
  return std::nullopt;
}

status llm_engine::check(const model& m, const engine_config& cfg) {
  const speculative_config& s = cfg.spec;
  if (auto e = validate(s, m.config)) return error{*e};
  const kv_eviction_config& ev = cfg.sched.eviction;
  if (auto e = validate(ev)) return error{*e};
  if (ev.enabled()) {
    if (auto why = why_no_eviction(s)) return error{*why};
    if (ev.budget > m.config.max_seq_len)
      return error{"a KV budget of " + std::to_string(ev.budget) + " tokens is past the model's context of " +
                   std::to_string(m.config.max_seq_len)};
  }
  for (const tier_config& t : cfg.sched.kv.tiers)
    if (auto e = validate(t)) return error{*e};
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
  step_path::drafts d{s, step_path::beside_scheduler(s, model_, cfg_.heads, &pool_), false,
                      step_path::max_tree_depth(s, cfg_.heads)};
  // A draft model and early exit run here too, beside the shard (the actors' draft actor).
  if (s.method == spec_method::early_exit) {
    if (cpu_shard == nullptr) throw std::invalid_argument("early exit runs on a CPU shard only");
    d.here = std::make_unique<model_proposer>(model_, *cpu_shard, s.exit_layer_for(model_.config.num_layers));
  } else if (s.method == spec_method::draft) {
    if (cpu_shard == nullptr) throw std::invalid_argument("a draft model runs beside a CPU shard only");
    d.here = std::make_unique<model_proposer>(*cfg_.draft, static_cast<int32_t>(cfg_.sched.kv.num_blocks),
                                              cfg_.sched.kv.block_size, cfg_.kv_type.value_or(kv_cache_type_for(*cfg_.draft)),
                                              pool_);
  }
  steps_.emplace(sched_, model_.config, std::move(d), [this](const planned_compaction& c) {
    const bool moved = shard_->compact_kv({c.block_table, c.kept, c.rotate, c.new_table});
    TROUPE_ASSERT(moved, "a shard that verifies trees or drafts over its own cache moves its KV");
  });
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
  steps_->forget(id);
  return sched_.abort(id);
}

// The step (step_path.hpp), its forward pass on this engine's shard.
std::vector<step_output> llm_engine::step() {
  steps_->plan_drafts(true);
  step_plan plan = sched_.schedule();
  stats_.preemptions += plan.preempted.size();
  steps_->draft(plan);
  // KV tiers: the loads first; a request one of whose blocks no tier held goes back to
  // compute before anything is sampled for it.
  std::vector<request_id> failed;
  if (tiers_) tiers_->prefetch(plan.tier_prefetch);
  if (tiers_ && !plan.tier_loads.empty()) failed = tiers_->load(plan.tier_loads);
  steps_->settle_loads(plan, failed);
  (void)steps_->ready(plan);  // (the shard leaves every row's features in hidden_)
  stats_.evicted_tokens = sched_.evicted_tokens();
  step_tokens got;
  batch_.clear();
  for (const auto& c : plan.compactions) batch_.compactions.push_back({c.block_table, c.kept, c.rotate, c.new_table});
  mass_.assign(static_cast<size_t>(plan.attention_sums()), 0.0f);
  std::span<const float> features;
  if (!plan.chunks.empty()) {
    fill_batch(plan);
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
      got = steps_->tokens_chosen(plan, chosen_);
    } else {
      logits_.resize(static_cast<size_t>(batch_.num_logits()) * vocab);
      shard_->forward(batch_, hidden_.data(), logits_.data());
      got = steps_->tokens_from_logits(plan, logits_.data(), vocab);
      features = std::span<const float>(hidden_.data(), hidden_.size());  // (CPU shards leave them)
    }
    if (tiers_) tiers_->save(plan.tier_saves, failed);
  }
  std::vector<step_output> outs = steps_->finish(plan, got, mass_, features);
  stats_.spec = steps_->tally();
  return outs;
}

// The batch of `plan`'s chunks: a chunk's known tokens, then its drafts (a token tree's
// with their parents); where each attention sum goes.
void llm_engine::fill_batch(const step_plan& plan) {
  float* mass = mass_.data();
  tree_parents_.resize(plan.chunks.size());
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const scheduled_chunk& c = plan.chunks[i];
    const request* r = sched_.find(c.id);
    std::span<const int32_t> toks = c.tokens;
    if (c.num_draft > 0) {  // (the known tokens and the drafts live apart: joined here)
      tokens_.assign(c.tokens.begin(), c.tokens.end());
      tokens_.insert(tokens_.end(), c.draft.begin(), c.draft.end());
      toks = tokens_;
    }
    if (!c.draft_parents.empty()) tree_parents_of(c.draft_parents, tree_parents_[i]);  // its root, then its nodes
    mass = batch_.add_chunk(toks, c.block_table,
                            {.start_pos = c.first_slot(),
                             .rope_pos = c.first_rope_position(),
                             .logit_rows = c.sample ? 1 + c.num_draft : 0,
                             .tree_parents = c.draft_parents.empty() ? nullptr : tree_parents_[i].data(),
                             .window_first = c.window_first.empty() ? nullptr : c.window_first.data(),
                             .attention = c.attention,
                             .by_token = c.attention_by_token()},
                            mass);
    if (r && c.first < r->num_prompt_tokens)
      stats_.prompt_tokens_computed += std::min(c.count, r->num_prompt_tokens - c.first);
  }
}

}  // namespace troupe
