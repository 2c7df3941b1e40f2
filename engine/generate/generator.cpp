#include "engine/generate/generator.hpp"

#include <algorithm>
#include <memory>

#include "engine/forward/transformer_shard.hpp"
#include "engine/generate/stop_matcher.hpp"
#include "engine/tokenizer/utf8_stream.hpp"

namespace troupe {

namespace {

struct sequence_state {
  size_t index;  // in the caller's request list
  const generation_request* req;
  std::vector<int32_t> tokens;  // prompt then generated
  std::vector<uint32_t> blocks;
  int32_t num_computed = 0;     // tokens whose KV is in the cache
  sampler smp;
  utf8_stream utf8;
  stop_matcher stops;
  generation_result result;
  bool finished = false;

  sequence_state(size_t i, const generation_request& r)
      : index(i), req(&r), tokens(r.prompt), smp(r.sampling, r.prompt), stops(r.stop_strings) {}
};

}  // namespace

generator::generator(const model& m, const tokenizer& tok, const generator_options& opts)
    : model_(m), tok_(tok), opts_(opts), pool_(opts.num_threads) {}

expected<std::vector<generation_result>> generator::generate(
    const std::vector<generation_request>& reqs, const token_callback& on_token) {
  const model_config& c = model_.config;
  const int32_t bs = opts_.block_size;
  if (bs < 1 || opts_.max_step_tokens < 1) return error{"block size and step budget must be positive"};

  int64_t total_blocks = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& r = reqs[i];
    const std::string who = "request " + std::to_string(i) + ": ";
    if (r.prompt.empty()) return error{who + "the prompt is empty"};
    if (static_cast<int64_t>(r.prompt.size()) >= c.max_seq_len)
      return error{who + "the prompt has " + std::to_string(r.prompt.size()) +
                   " tokens; the model's context is " + std::to_string(c.max_seq_len)};
    for (int32_t t : r.prompt)
      if (t < 0 || t >= c.vocab_size)
        return error{who + "token id " + std::to_string(t) + " is outside the vocabulary (" +
                     std::to_string(c.vocab_size) + ")"};
    if (r.max_tokens < 1) return error{who + "max_tokens must be at least 1"};
    if (auto e = validate(r.sampling)) return error{who + *e};
    const int64_t len = std::min<int64_t>(int64_t{c.max_seq_len}, int64_t{static_cast<int64_t>(r.prompt.size())} + r.max_tokens);
    total_blocks += (len + bs - 1) / bs;
  }
  if (reqs.empty()) return std::vector<generation_result>{};
  if (total_blocks > (int64_t{1} << 31)) return error{"the requests need more KV blocks than fit in memory"};

  shard_spec spec;
  kv_cache cache(transformer_shard::cache_shape(c, spec, static_cast<int32_t>(total_blocks), bs));
  no_collective solo;
  transformer_shard shard(model_, spec, cache, pool_, solo);

  std::vector<std::unique_ptr<sequence_state>> seqs;
  uint32_t next_block = 0;
  for (const auto& r : reqs) {
    auto s = std::make_unique<sequence_state>(seqs.size(), r);
    const int64_t len = std::min<int64_t>(c.max_seq_len, static_cast<int64_t>(r.prompt.size()) + r.max_tokens);
    for (int64_t b = 0; b < (len + bs - 1) / bs; ++b) s->blocks.push_back(next_block++);
    seqs.push_back(std::move(s));
  }

  step_batch batch;
  std::vector<float> hidden, logits;
  std::vector<sequence_state*> in_batch;  // parallel to batch.sequences
  for (;;) {
    batch.clear();
    in_batch.clear();
    int32_t budget = opts_.max_step_tokens;
    for (auto& s : seqs) {
      if (s->finished) continue;
      const int32_t pending = static_cast<int32_t>(s->tokens.size()) - s->num_computed;
      const int32_t n = std::min(pending, std::max(budget, 1));
      if (budget <= 0 && pending > 1) continue;  // prefill waits for the next step
      const bool last = n == pending;
      batch.add(std::span(s->tokens).subspan(s->num_computed, n), s->num_computed, s->blocks, last);
      in_batch.push_back(s.get());
      budget -= n;
    }
    if (batch.sequences.empty()) break;
    hidden.resize(int64_t{batch.num_tokens()} * c.dim);
    logits.resize(int64_t{batch.num_logits()} * c.vocab_size);
    shard.forward(batch, hidden.data(), logits.data());

    size_t row = 0;
    for (size_t i = 0; i < batch.sequences.size(); ++i) {
      sequence_state& s = *in_batch[i];
      s.num_computed += batch.sequences[i].num_tokens;
      if (!batch.sequences[i].want_logits) continue;
      sample_result r = s.smp.sample(logits.data() + static_cast<int64_t>(row++) * c.vocab_size, c.vocab_size);
      const int32_t tok = r.token;
      const auto& req = *s.req;
      token_event ev;
      if ((!req.ignore_eos && (tok == tok_.eos_id() || tok == tok_.bos_id())) ||
          std::find(req.stop_tokens.begin(), req.stop_tokens.end(), tok) != req.stop_tokens.end()) {
        s.result.reason = finish_reason::stop;
        s.finished = true;
      } else {
        const int32_t prev = s.tokens.back();
        s.tokens.push_back(tok);
        s.result.tokens.push_back(tok);
        if (req.sampling.logprobs >= 0) s.result.logprobs.push_back(std::move(r));
        ev.token = tok;
        ev.text = s.stops.push(s.utf8.push(tok_.decode(prev, tok)));
        if (s.stops.stopped()) {
          s.result.reason = finish_reason::stop;
          s.finished = true;
        } else if (static_cast<int32_t>(s.result.tokens.size()) >= req.max_tokens ||
                   static_cast<int32_t>(s.tokens.size()) >= c.max_seq_len) {
          s.result.reason = finish_reason::length;
          s.finished = true;
        }
      }
      if (s.finished && !s.stops.stopped()) ev.text += s.stops.push(s.utf8.finish()) + s.stops.flush();
      ev.finished = s.finished;
      s.result.text += ev.text;
      if (on_token) on_token(s.index, ev);
    }
  }
  std::vector<generation_result> out;
  for (auto& s : seqs) out.push_back(std::move(s->result));
  return out;
}

}  // namespace troupe
