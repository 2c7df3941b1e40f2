// troupe-run's work: the model and tokenizer loaded, one request generated and printed as
// it is produced, and a summary.
#include <chrono>
#include <cstdio>
#include <thread>

#include "engine/generate/generator.hpp"
#include "engine/sample/sampling_params.hpp"
#include "tools/common/cli.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/troupe-run/run_options.hpp"

namespace troupe::tools {

void add_run_options(CLI::App& app, run_options& o) {
  app.add_option("model", o.model_path, "checkpoint: llama2.c .bin, .gguf, or a Hugging Face model directory")->required();
  app.add_option("-z,--tokenizer", o.tokenizer_path,
                 "tokenizer.json or llama2.c tokenizer.bin (default: the GGUF's own vocabulary, a model directory's tokenizer.json, else tokenizer.bin beside the model)");
  app.add_option("-p,--prompt", o.prompt, "prompt text (default: empty, start from BOS)");
  app.add_option("-n,--steps", o.steps,
                 "tokens after BOS, prompt included, as llama2.c's run counts them; 0: the model's context")
      ->check(CLI::Range(0, 1 << 22))->capture_default_str();
  app.add_option("-t,--temperature", o.temperature, "0 is greedy")->check(CLI::Range(0.0f, 100.0f))->capture_default_str();
  app.add_option("--top-p", o.top_p, "nucleus sampling mass, in (0, 1]")->capture_default_str();
  app.add_option("--top-k", o.top_k, "keep the k most likely tokens; 0: all")->check(non_negative())->capture_default_str();
  app.add_option("--min-p", o.min_p, "drop tokens below this fraction of the top probability")->capture_default_str();
  app.add_option("--repeat-penalty", o.rep, "repetition penalty over prompt and output; 1: off")->capture_default_str();
  app.add_option("--frequency-penalty", o.freq, "in [-2, 2]")->capture_default_str();
  app.add_option("--presence-penalty", o.pres, "in [-2, 2]")->capture_default_str();
  app.add_option("--logit-bias", o.biases, "TOKEN=BIAS (repeatable): add BIAS, in [-100, 100], to the token's logit before each choice")
      ->check(token_bias_entry());
  app.add_option("-s,--seed", o.seed, "random seed (default: from the clock)");
  app.add_option("--stop", o.stops, "stop string (repeatable); the output ends before it");
  app.add_option("--logprobs", o.logprobs, "print the log-probability of each token and of the N most likely (0..20)")
      ->check(CLI::Range(0, 20));
  app.add_option("-j,--threads", o.threads, "worker threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--ids", o.ids, "print token ids instead of text");
  app.add_flag("-q,--quiet", o.quiet, "no loading line or speed summary on stderr");
  add_speculative_options(app, o.spec);
  add_eviction_options(app, o.eviction);
  app.add_flag("--ignore-eos", o.ignore_eos, "generate through end-of-sequence tokens, to -n");
}

namespace {

double seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// On stderr: the times and speed, what eviction dropped, and how speculation did (at each
// depth, of the verify steps whose drafts reached it, the share that kept a draft there: a
// Medusa head's own acceptance, head d guessing depth d).
void print_summary(const generation_result& r, size_t prompt_tokens, double load_s, double first_s, double decode_s,
                   const engine_stats& st, const kv_eviction_config& eviction, const speculative_config& spec) {
  std::fprintf(stderr, "troupe-run: load %.2f s, prompt %zu tokens, first token %.1f ms, %zu tokens at %.1f tok/s (%s)\n",
               load_s, prompt_tokens, 1e3 * first_s, r.tokens.size(),
               r.tokens.size() > 1 && decode_s > 0 ? (r.tokens.size() - 1) / decode_s : 0.0,
               r.reason == finish_reason::stop ? "stopped" : "length");
  if (eviction.enabled())
    std::fprintf(stderr, "troupe-run: KV eviction (%s, budget %d): %llu tokens evicted\n",
                 std::string(kv_policy_name(eviction.policy)).c_str(), eviction.budget,
                 static_cast<unsigned long long>(st.evicted_tokens));
  if (!spec.enabled() || st.spec.verifies == 0) return;
  std::fprintf(stderr, "troupe-run: speculative: %llu of %llu drafts accepted (%.0f%%), %.2f tokens per verify step\n",
               static_cast<unsigned long long>(st.spec.accepted), static_cast<unsigned long long>(st.spec.proposed),
               100.0 * static_cast<double>(st.spec.accepted) / static_cast<double>(std::max<uint64_t>(st.spec.proposed, 1)),
               1.0 + static_cast<double>(st.spec.accepted) / static_cast<double>(st.spec.verifies));
  std::string depths;
  for (size_t d = 0; d < st.spec.offered_at.size() && st.spec.offered_at[d] > 0; ++d) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%zu: %.0f%% of %llu", depths.empty() ? "" : ", ", d + 1,
                  100.0 * static_cast<double>(st.spec.kept_at[d]) / static_cast<double>(st.spec.offered_at[d]),
                  static_cast<unsigned long long>(st.spec.offered_at[d]));
    depths += buf;
  }
  if (!depths.empty()) std::fprintf(stderr, "troupe-run: speculative: drafts kept at depth %s\n", depths.c_str());
}

}  // namespace

int run(const run_options& o) {
  const int32_t threads = o.threads > 0 ? o.threads : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t seed = o.seed >= 0 ? o.seed : std::chrono::steady_clock::now().time_since_epoch().count();

  const auto t0 = std::chrono::steady_clock::now();
  auto loaded = load_model_and_tokenizer(o.model_path, o.tokenizer_path);
  if (!loaded) {
    std::fprintf(stderr, "troupe-run: %s\n", loaded.err().message.c_str());
    return 1;
  }
  const model& m = loaded->m;
  const tokenizer& tok = *loaded->tok;
  if (!o.quiet)
    std::fprintf(stderr, "troupe-run: %s: %s, %s, %d threads; %s\n", m.path.c_str(), m.format.c_str(),
                 describe(m.config).c_str(), threads, transformer_shard::cpu_kernels(m).c_str());
  speculative_models spec_models;
  auto spec = speculative_from(o.spec, m, &tok.vocab(), spec_models);
  const std::optional<model>& draft = spec_models.draft;
  if (!spec) {
    std::fprintf(stderr, "troupe-run: %s\n", spec.err().message.c_str());
    return 1;
  }
  if (!o.quiet && spec->enabled()) {
    std::string how = std::string(spec_method_name(spec->method)) + ", " + spec->drafts_text();
    if (spec->method == spec_method::draft) how += ", draft " + draft->path + " (" + describe(draft->config) + ")";
    if (spec_models.heads) how += ", " + spec_models.heads->describe() + " from " + spec_models.heads->path;
    if (spec->method == spec_method::early_exit)
      how += ", exit after layer " + std::to_string(spec->exit_layer_for(m.config.num_layers)) + " of " +
             std::to_string(m.config.num_layers);
    std::fprintf(stderr, "troupe-run: speculative decoding: %s\n", how.c_str());
  }

  generation_request req;
  req.prompt = tok.encode(o.prompt, true);
  req.sampling.temperature = o.temperature;
  req.sampling.top_p = o.top_p;
  req.sampling.top_k = o.top_k;
  req.sampling.min_p = o.min_p;
  req.sampling.repetition_penalty = o.rep;
  req.sampling.frequency_penalty = o.freq;
  req.sampling.presence_penalty = o.pres;
  req.sampling.seed = static_cast<uint64_t>(seed);
  req.sampling.logprobs = o.logprobs;
  req.sampling.logit_bias = parse_token_biases(o.biases);
  req.stop_strings = o.stops;
  auto evicting = eviction_config_of(o.eviction, m.config);
  if (!evicting) {
    std::fprintf(stderr, "troupe-run: %s\n", evicting.err().message.c_str());
    return 1;
  }
  const kv_eviction_config eviction = *evicting;
  req.ignore_eos = o.ignore_eos;
  // Positions after BOS (where the prompt starts with one: Qwen2's text does not);
  // the sequence with BOS must fit the model's context, but where streaming eviction keeps
  // the positions within the budget.
  const int32_t bos = tok.leading_bos(req.prompt);
  const bool past_context = eviction.rope_in_cache();
  const int32_t limit = o.steps == 0 || (o.steps >= m.config.max_seq_len && !past_context) ? m.config.max_seq_len - bos : o.steps;
  const auto prompt_after_bos = static_cast<int32_t>(req.prompt.size()) - bos;
  if (prompt_after_bos >= limit) {
    std::fprintf(stderr, "troupe-run: the prompt is %d tokens; -n %d leaves no room to generate (the context is %d)\n",
                 prompt_after_bos, o.steps, m.config.max_seq_len);
    return 1;
  }
  req.max_tokens = limit - prompt_after_bos;
  // Before anything is printed, so that a bad flag's error stands alone.
  if (auto bad = validate(req.sampling)) {
    std::fprintf(stderr, "troupe-run: %s\n", bad->c_str());
    return 1;
  }
  for (const auto& b : req.sampling.logit_bias)
    if (b.token >= tok.size()) {
      std::fprintf(stderr, "troupe-run: --logit-bias: token %d is outside the vocabulary (%d tokens)\n", b.token, tok.size());
      return 1;
    }

  // Echo the prompt.
  if (o.ids) {
    for (size_t i = bos; i < req.prompt.size(); ++i) std::printf("%d ", req.prompt[i]);
  } else {
    std::printf("%s", tok.decode_all(std::vector<int32_t>(req.prompt.begin() + bos, req.prompt.end())).c_str());
  }
  std::fflush(stdout);

  generator_options opts;
  opts.num_threads = threads;
  opts.spec = *spec;
  opts.draft = draft ? &*draft : nullptr;
  opts.heads = spec_models.heads.get();
  opts.eviction = eviction;
  generator gen(m, tok, opts);
  const auto t1 = std::chrono::steady_clock::now();
  auto first_token = t1;
  int64_t produced = 0;
  auto result = gen.generate({req}, [&](size_t, const token_event& ev) {
    if (produced == 0) first_token = std::chrono::steady_clock::now();
    produced += static_cast<int64_t>(ev.tokens.size());
    if (o.ids) {
      for (int32_t t : ev.tokens) std::printf("%d ", t);
    } else {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
    }
    std::fflush(stdout);
  });
  if (!result) {
    std::fprintf(stderr, "\ntroupe-run: %s\n", result.err().message.c_str());
    return 1;
  }
  std::printf("\n");
  std::fflush(stdout);
  const auto t2 = std::chrono::steady_clock::now();
  const auto& r = (*result)[0];
  if (o.logprobs >= 0) {
    for (size_t i = 0; i < r.logprobs.size(); ++i) {
      const auto& lp = r.logprobs[i];
      std::printf("%4zu %6d %-16s %9.4f", i, lp.token, ("'" + std::string(tok.decode(0, lp.token)) + "'").c_str(), lp.logprob);
      for (const auto& t : lp.top) std::printf("  %d:%.3f", t.token, t.logprob);
      std::printf("\n");
    }
  }
  if (!o.quiet)
    print_summary(r, req.prompt.size(), seconds(t0, t1), seconds(t1, first_token), seconds(first_token, t2),
                  gen.last_stats(), eviction, *spec);
  return 0;
}

}  // namespace troupe::tools
