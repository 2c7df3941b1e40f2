#include "engine/serve/llm_engine.hpp"

#include "engine/forward/cuda_shard.hpp"
#include "engine/forward/kv_cache_type.hpp"
#include "engine/serve/step_choices.hpp"

namespace troupe {

engine_config llm_engine::complete(engine_config cfg, const model& m) {
  if (cfg.sched.context == 0) cfg.sched.context = m.config.max_seq_len;
  if (cfg.sched.vocab == 0) cfg.sched.vocab = m.config.vocab_size;
  return cfg;
}

// (With a shard made elsewhere, the pool is not used: one thread.)
llm_engine::llm_engine(const model& m, const tokenizer& tok, engine_config cfg, std::unique_ptr<forward_shard> shard)
    : model_(m), cfg_(complete(cfg, m)), sched_(cfg_.sched, tok), pool_(1), shard_(std::move(shard)) {
  TROUPE_ASSERT(shard_ && shard_->is_first_stage() && shard_->is_last_stage(), "the shard runs every layer");
}

llm_engine::llm_engine(const model& m, const tokenizer& tok, engine_config cfg)
    : model_(m), cfg_(complete(cfg, m)), sched_(cfg_.sched, tok), pool_(cfg_.num_threads) {
  cache_ = std::make_unique<kv_cache>(transformer_shard::cache_shape(
      m.config, shard_spec{}, static_cast<int32_t>(cfg_.sched.kv.num_blocks), cfg_.sched.kv.block_size,
      cfg_.kv_type.value_or(kv_cache_type_for(m))));
  shard_ = std::make_unique<transformer_shard>(m, shard_spec{}, *cache_, pool_, solo_);
}

expected<std::unique_ptr<llm_engine>> llm_engine::on_gpu(const model& m, const tokenizer& tok, engine_config cfg,
                                                         gpu_placement where) {
  if (cfg.kv_type) return error{"a KV cache type applies to the CPU; a GPU shard keeps its cache in its own type"};
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

std::optional<step_output> llm_engine::abort(request_id id) { return sched_.abort(id); }

std::vector<step_output> llm_engine::step() {
  const step_plan plan = sched_.schedule();
  stats_.preemptions += plan.preempted.size();
  samples_.clear();
  if (!plan.chunks.empty()) {
    batch_.clear();
    for (const auto& c : plan.chunks) {
      batch_.add(c.tokens, c.first, c.block_table, c.sample);
      if (const request* r = sched_.find(c.id); r && c.first < r->num_prompt_tokens)
        stats_.prompt_tokens_computed += std::min(c.count, r->num_prompt_tokens - c.first);
    }
    const int32_t vocab = model_.config.vocab_size;
    hidden_.resize(static_cast<size_t>(batch_.num_tokens()) * model_.config.dim);
    ++stats_.steps;
    stats_.tokens_computed += batch_.num_tokens();
    // Who chooses the tokens (step_choices.hpp): the shard where its logits are, when
    // every row allows it and the shard does (a CPU shard declines: its logits are
    // already here); else each sampler from its row.
    const std::vector<token_choice> choices = shard_choices(plan, sched_);
    chosen_.assign(choices.size(), 0);
    if (!choices.empty() && shard_->forward_choose(batch_, hidden_.data(), choices.data(), chosen_.data())) {
      samples_ = replay_chosen(plan, sched_, chosen_);
    } else {
      logits_.resize(static_cast<size_t>(batch_.num_logits()) * vocab);
      shard_->forward(batch_, hidden_.data(), logits_.data());
      samples_ = sample_rows(plan, sched_, logits_.data(), vocab);
    }
  }
  return sched_.update_from_output(plan, samples_);
}

}  // namespace troupe
