#include "engine/serve/llm_engine.hpp"

namespace troupe {

engine_config llm_engine::complete(engine_config cfg, const model& m) {
  if (cfg.sched.context == 0) cfg.sched.context = m.config.max_seq_len;
  if (cfg.sched.vocab == 0) cfg.sched.vocab = m.config.vocab_size;
  return cfg;
}

llm_engine::llm_engine(const model& m, const tokenizer& tok, engine_config cfg)
    : model_(m),
      cfg_(complete(cfg, m)),
      sched_(cfg_.sched, tok),
      pool_(cfg_.num_threads),
      cache_(transformer_shard::cache_shape(m.config, shard_spec{}, static_cast<int32_t>(cfg_.sched.num_blocks),
                                            cfg_.sched.block_size, cfg_.kv_type.value_or(transformer_shard::kv_type_for(m)))),
      shard_(m, shard_spec{}, cache_, pool_, solo_) {}

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
    logits_.resize(static_cast<size_t>(batch_.num_logits()) * vocab);
    shard_.forward(batch_, hidden_.data(), logits_.data());
    ++stats_.steps;
    stats_.tokens_computed += batch_.num_tokens();
    size_t row = 0;
    for (const auto& c : plan.chunks) {
      if (!c.sample) continue;
      request* r = sched_.find(c.id);
      samples_.push_back(r->smp.sample(logits_.data() + row++ * vocab, vocab));
    }
  }
  return sched_.update_from_output(plan, samples_);
}

}  // namespace troupe
