#include "engine/serve/llm_engine.hpp"

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
      m.config, shard_spec{}, static_cast<int32_t>(cfg_.sched.num_blocks), cfg_.sched.block_size,
      cfg_.kv_type.value_or(transformer_shard::kv_type_for(m))));
  shard_ = std::make_unique<transformer_shard>(m, shard_spec{}, *cache_, pool_, solo_);
}

expected<std::unique_ptr<llm_engine>> llm_engine::on_gpu(const model& m, const tokenizer& tok, engine_config cfg,
                                                         gpu_placement where) {
  if (cfg.kv_type) return error{"a KV cache type applies to the CPU; a GPU shard keeps its cache in its own type"};
  cfg = complete(cfg, m);
  cuda_shard_options o;
  o.device = where.device;
  o.weights = where.weights;
  o.num_blocks = static_cast<int32_t>(cfg.sched.num_blocks);
  o.block_size = cfg.sched.block_size;
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
    if (!choose_on_shard(plan)) {
      logits_.resize(static_cast<size_t>(batch_.num_logits()) * vocab);
      shard_->forward(batch_, hidden_.data(), logits_.data());
      size_t row = 0;
      for (const auto& c : plan.chunks) {
        if (!c.sample) continue;
        request* r = sched_.find(c.id);
        samples_.push_back(r->smp.sample(logits_.data() + row++ * vocab, vocab));
      }
    }
  }
  return sched_.update_from_output(plan, samples_);
}

// When every sampled row's choice needs only the logits, the shard may make them where
// the logits are (a GPU's: only the ids come back), with the uniforms the samplers would
// draw; each sampler then replays its token. False, with nothing run, otherwise (a CPU
// shard never does: its logits are already on the host).
bool llm_engine::choose_on_shard(const step_plan& plan) {
  choices_.clear();
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    const request* r = sched_.find(c.id);
    if (!r->smp.needs_only_logits()) return false;
    choices_.push_back(r->smp.next_choice());
  }
  if (choices_.empty()) return false;
  chosen_.assign(choices_.size(), 0);
  if (!shard_->forward_choose(batch_, hidden_.data(), choices_.data(), chosen_.data())) return false;
  size_t k = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    sched_.find(c.id)->smp.replay(chosen_[k]);
    sample_result s;
    s.token = chosen_[k++];
    samples_.push_back(s);
  }
  return true;
}

}  // namespace troupe
