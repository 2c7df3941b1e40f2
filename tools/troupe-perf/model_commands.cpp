// troupe-perf's subcommands over a model: decode, prefill and batch on the CPU through the
// generator, eviction's quality, calibrate; the model loading serve and gpu share.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "engine/generate/generator.hpp"
#include "engine/forward/transformer_shard.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/common/stats.hpp"
#include "tools/troupe-perf/calibrate.hpp"
#include "tools/troupe-perf/commands.hpp"
#include "tools/troupe-perf/report.hpp"
#include "tools/troupe-perf/triad.hpp"

namespace troupe::tools {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Decodes `tokens` tokens for each of `sequences` sequences after a short prompt, in one
// batch, greedy; returns generated tokens per second (all sequences together), the
// median of `runs` runs. `stats`: the last run's.
double decode_rate(const model& m, const tokenizer& tok, const decode_setup& d, int threads, int sequences, int tokens,
                   int runs, engine_stats* stats = nullptr) {
  generator_options opts;
  opts.num_threads = threads;
  opts.spec = d.spec;
  opts.draft = d.draft;
  opts.heads = d.heads;
  opts.eviction = d.eviction;
  generator gen(m, tok, opts);
  std::vector<generation_request> reqs(sequences);
  for (int s = 0; s < sequences; ++s) {
    reqs[s].prompt = {tok.bos_id(), 100 + s % 50, 200 + s % 30};
    for (int32_t& t : reqs[s].prompt) t = std::min(t, m.config.vocab_size - 1);
    reqs[s].sampling.temperature = 0.0f;
    reqs[s].max_tokens = tokens;
    reqs[s].ignore_eos = true;
  }
  std::vector<double> rates;
  for (int r = 0; r < runs + 1; ++r) {  // the first run warms the page cache and mappings
    int64_t produced = 0;
    clock_type::time_point first{};
    auto res = gen.generate(reqs, [&](size_t, const token_event& ev) {
      // (Every sequence's first token comes from the prefill step.)
      if (produced < sequences && produced + static_cast<int64_t>(ev.tokens.size()) >= sequences) first = clock_type::now();
      produced += static_cast<int64_t>(ev.tokens.size());
    });
    const double secs = seconds_since(first);
    if (!res) {
      std::fprintf(stderr, "troupe-perf: %s\n", res.err().message.c_str());
      std::exit(1);
    }
    if (r > 0) rates.push_back((produced - sequences) / secs);
    if (stats) *stats = gen.last_stats();
  }
  return median(rates);
}

double prefill_rate(const model& m, const tokenizer& tok, int threads, int prompt_tokens, int runs) {
  generator_options opts;
  opts.num_threads = threads;
  opts.max_step_tokens = prompt_tokens;
  generator gen(m, tok, opts);
  generation_request req;
  req.prompt.push_back(tok.bos_id());
  for (int i = 1; i < prompt_tokens; ++i) req.prompt.push_back(3 + (i * 7919) % (m.config.vocab_size - 3));
  req.sampling.temperature = 0.0f;
  req.max_tokens = 1;
  req.ignore_eos = true;
  std::vector<double> rates;
  for (int r = 0; r < runs + 1; ++r) {
    auto t0 = clock_type::now();
    auto res = gen.generate({req});
    const double secs = seconds_since(t0);
    if (!res) {
      std::fprintf(stderr, "troupe-perf: %s\n", res.err().message.c_str());
      std::exit(1);
    }
    if (r > 0) rates.push_back(prompt_tokens / secs);
  }
  return median(rates);
}

// After a decode row: how speculation did in the last run.
std::string spec_note(const speculative_config& spec, const engine_stats& s) {
  if (!spec.enabled() || s.spec.verifies == 0) return "";
  char buf[128];
  std::snprintf(buf, sizeof buf, "; %.0f%% of drafts accepted, %.2f tokens per verify",
                100.0 * static_cast<double>(s.spec.accepted) / static_cast<double>(std::max<uint64_t>(s.spec.proposed, 1)),
                1.0 + static_cast<double>(s.spec.accepted) / static_cast<double>(s.spec.verifies));
  return buf;
}

}  // namespace

void model_commands::add(CLI::App& app) {
  auto add_model = [&](CLI::App* sub) {
    sub->add_option("model", model_path, "checkpoint")->required();
    sub->add_option("-z,--tokenizer", tokenizer_path, "tokenizer.bin for llama2.c checkpoints");
  };
  decode = app.add_subcommand("decode", "single-stream decode");
  add_model(decode);
  decode->add_option("-n,--tokens", tokens, "tokens to generate per run")->check(CLI::Range(2, 100000))->capture_default_str();
  add_speculative_options(*decode, spec);
  add_eviction_options(*decode, evict);
  prefill = app.add_subcommand("prefill", "prompt processing");
  add_model(prefill);
  prefill->add_option("-p,--prompt-tokens", prompt_tokens)->check(CLI::Range(2, 100000))->capture_default_str();
  batch = app.add_subcommand("batch", "batched decode");
  add_model(batch);
  batch->add_option("-b,--batch", batches, "sequences per batch")->delimiter(',')->check(CLI::Range(1, 4096));
  batch->add_option("-n,--tokens", tokens, "tokens to generate per sequence")->check(CLI::Range(2, 100000))->capture_default_str();
  add_speculative_options(*batch, spec);
  add_eviction_options(*batch, evict);

  eviction = app.add_subcommand("eviction", "KV eviction's quality: the full-cache perplexity of each policy's generations");
  add_model(eviction);
  eviction->add_option("--texts", quality.texts, "seeded generations per row")->check(CLI::Range(1, 10000))->capture_default_str();
  eviction->add_option("--length", quality.length, "tokens each generates (default: the context, less the prompt)")
      ->check(CLI::Range(0, 1 << 20));
  eviction->add_option("--budgets", quality.budgets, "budgets, in percent of --length")->delimiter(',')->check(CLI::Range(1, 100));
  eviction->add_option("--policies", quality.policies, "policies to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"streaming", "h2o", "scissorhands"}));
  eviction->add_option("--long", quality.long_factor, "streaming runs this many contexts long, segment by segment (1: not at all)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  eviction->add_option("-t,--temperature", quality.temperature)->check(CLI::Range(0.0f, 100.0f))->capture_default_str();

  serve = app.add_subcommand("serve", "serving loop under concurrent requests");
  add_model(serve);
  add_speculative_options(*serve, spec);
  add_serve_options(*serve, serving);

  calibrate = app.add_subcommand("calibrate", "this machine's rates as troupe-plan reads them (a profile file)");
  add_model(calibrate);
  calibrate->add_option("-o,--out", profile_path, "the profile to write")->required();

  gpu = app.add_subcommand("gpu", "decode on a GPU shard (builds with CUDA)");
  add_model(gpu);
  add_gpu_options(*gpu, device);
}

bool model_commands::parsed() const {
  for (const CLI::App* sub : {decode, prefill, batch, eviction, calibrate, serve, gpu})
    if (sub->parsed()) return true;
  return false;
}

int model_commands::run(const perf_context& c) {
  auto loaded = load_model_and_tokenizer(model_path, tokenizer_path);
  if (!loaded) {
    std::fprintf(stderr, "troupe-perf: %s\n", loaded.err().message.c_str());
    return 1;
  }
  const model& m = loaded->m;
  const tokenizer& tok = *loaded->tok;
  const bool on_device = gpu->parsed() || (serve->parsed() && serving.device != "cpu");
  if (on_device)  // (the device and its weights are named below)
    std::fprintf(stderr, "troupe-perf: %s: %s, %s\n", m.path.c_str(), m.format.c_str(), describe(m.config).c_str());
  else
    std::fprintf(stderr, "troupe-perf: %s: %s, %s, %d threads; %s\n", m.path.c_str(), m.format.c_str(),
                 describe(m.config).c_str(), c.threads, transformer_shard::cpu_kernels(m).c_str());
  speculative_models spec_models;
  auto sc = speculative_from(spec, m, m.vocab ? &*m.vocab : nullptr, spec_models);
  if (!sc) {
    std::fprintf(stderr, "troupe-perf: %s\n", sc.err().message.c_str());
    return 1;
  }
  auto ec = eviction_config_of(evict, m.config);
  if (!ec) {
    std::fprintf(stderr, "troupe-perf: %s\n", ec.err().message.c_str());
    return 1;
  }
  const decode_setup d{*sc, spec_models.draft ? &*spec_models.draft : nullptr, spec_models.heads.get(), *ec};
  if (eviction->parsed()) {
    quality.threads = c.threads;
    run_eviction_bench(m, tok, quality);
    return 0;
  }
  if (gpu->parsed()) return run_gpu_command(m, device, c);
  if (serve->parsed()) return run_serve_command(m, tok, serving, d, c);
  if (calibrate->parsed()) {
    calibration_probes probes;
    probes.decode_1 = [&](int t) { return decode_rate(m, tok, d, t, 1, tokens, c.runs); };
    probes.decode_16 = [&](int t) { return decode_rate(m, tok, d, t, 16, 32, c.runs); };
    probes.prefill_128 = [&](int t) { return prefill_rate(m, tok, t, 128, c.runs); };
    probes.read_gbs = [&](int t) {
      thread_pool pool(t);
      return measure_bandwidth(pool, size_t{512} << 20, c.runs).read_gbs;
    };
    probes.report = [](const std::string& what, double v, const std::string& unit) { report(what, v, unit); };
    const plan::hardware_profile h = tools::calibrate(m, c.threads, probes);
    std::ofstream f(profile_path);
    f << plan::profile_to_json(h);
    if (!f) {
      std::fprintf(stderr, "troupe-perf: %s: cannot write\n", profile_path.c_str());
      return 1;
    }
    std::fprintf(stderr, "troupe-perf: wrote %s (%s)\n", profile_path.c_str(), h.name.c_str());
    return 0;
  }
  if (prefill->parsed()) {
    report("prefill, " + std::to_string(prompt_tokens) + " tokens, " + std::to_string(c.threads) + " threads",
           prefill_rate(m, tok, c.threads, prompt_tokens, c.runs), "tok/s");
    return 0;
  }
  // decode and batch: the speculation and eviction each row ran with.
  std::string with = d.spec.enabled() ? ", speculative " + std::string(spec_method_name(d.spec.method)) + ", " + d.spec.drafts_text() : "";
  if (d.eviction.enabled())
    with += ", KV " + std::string(kv_policy_name(d.eviction.policy)) + " budget " + std::to_string(d.eviction.budget);
  engine_stats stats;
  if (decode->parsed()) {
    const double r = decode_rate(m, tok, d, c.threads, 1, tokens, c.runs, &stats);
    const std::string note = spec_note(d.spec, stats);
    const double bytes = static_cast<double>(m.weights.streamed_bytes());
    report("decode, 1 sequence, " + std::to_string(c.threads) + " threads" + with, r, "tok/s",
           note.empty() ? std::to_string(r * bytes / 1e9).substr(0, 5) + " GB/s of weights" : note.substr(2));
    return 0;
  }
  for (int b : batches) {
    const double r = decode_rate(m, tok, d, c.threads, b, tokens, c.runs, &stats);
    report("decode, " + std::to_string(b) + " sequences, " + std::to_string(c.threads) + " threads" + with, r, "tok/s",
           "all sequences together" + spec_note(d.spec, stats));
  }
  return 0;
}

}  // namespace troupe::tools
