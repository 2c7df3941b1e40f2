#include "engine/generate/generator.hpp"

#include <algorithm>

namespace troupe {

generator::generator(const model& m, const tokenizer& tok, const generator_options& opts)
    : model_(m), tok_(tok), opts_(opts) {}

expected<std::vector<generation_result>> generator::generate(const std::vector<generation_request>& reqs,
                                                             const token_callback& on_token) {
  const model_config& c = model_.config;
  const int32_t bs = opts_.block_size;
  if (bs < 1 || opts_.max_step_tokens < 1 || opts_.max_running < 1)
    return error{"block size, step budget and running cap must be positive"};
  uint64_t blocks = opts_.num_blocks;
  if (blocks == 0) {
    for (const auto& r : reqs) {
      // (Drafts take positions past the last token: as many as a step may draft.)
      const int64_t drafts = !opts_.spec.enabled()    ? 0
                             : opts_.spec.tree.empty() ? opts_.spec.k
                                                       : std::max(opts_.spec.tree_nodes(), opts_.spec.tree_auto);
      int64_t len = std::min<int64_t>(c.max_seq_len, static_cast<int64_t>(r.prompt.size()) + std::max(r.max_tokens, 1)) + drafts;
      if (opts_.eviction.enabled()) len = std::min<int64_t>(len, opts_.eviction.budget + drafts);
      blocks += static_cast<uint64_t>((len + bs - 1) / bs);
    }
    blocks = std::max<uint64_t>(blocks, 1);
  }
  if (blocks > (uint64_t{1} << 24)) return error{"the requests need more KV blocks than fit in memory"};

  engine_config cfg;
  cfg.num_threads = opts_.num_threads;
  cfg.sched.kv.block_size = bs;
  cfg.sched.kv.num_blocks = static_cast<uint32_t>(blocks);
  cfg.sched.max_step_tokens = opts_.max_step_tokens;
  cfg.sched.max_running = opts_.max_running;
  cfg.sched.kv.prefix_caching = opts_.prefix_caching;
  cfg.kv_type = opts_.kv_type;
  cfg.spec = opts_.spec;
  cfg.draft = opts_.draft;
  cfg.heads = opts_.heads;
  cfg.sched.eviction = opts_.eviction;
  if (auto st = llm_engine::check(model_, cfg); !st) return st.err();
  llm_engine engine(model_, tok_, cfg);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (auto st = engine.add_request(request_id{i}, reqs[i]); !st) return st.err();
  }
  std::vector<generation_result> out(reqs.size());
  while (engine.has_unfinished()) {
    for (step_output& o : engine.step()) {
      const size_t i = o.id.value;
      generation_result& g = out[i];
      g.tokens.insert(g.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      for (auto& lp : o.logprobs) g.logprobs.push_back(std::move(lp));
      g.text += o.text;
      if (o.finished) g.reason = o.reason;
      if (on_token) on_token(i, token_event{o.new_tokens, o.text, o.finished});
    }
  }
  stats_ = engine.stats();
  return out;
}

}  // namespace troupe
