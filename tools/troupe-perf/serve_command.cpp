// troupe-perf serve: the serving loop of one engine (serve_bench.hpp) under concurrent
// requests, level after level of concurrency, optionally in rounds.
#include <cstdio>
#include <memory>
#include <optional>

#include "engine/forward/cuda_shard.hpp"
#include "tools/troupe-perf/commands.hpp"
#include "tools/troupe-perf/report.hpp"
#include "tools/troupe-perf/serve_bench.hpp"

namespace troupe::tools {

void add_serve_options(CLI::App& sub, serve_options& o) {
  sub.add_option("-c,--concurrency", o.concurrency, "requests kept in flight")->delimiter(',')->check(CLI::Range(1, 4096));
  sub.add_option("-p,--prompt-tokens", o.prompt_tokens, "prompt length, BOS included")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub.add_option("-n,--output-tokens", o.output_tokens, "tokens generated per request")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub.add_option("--requests", o.requests, "requests per run (default: 2 x concurrency, at least 4)")->check(CLI::Range(0, 1 << 20));
  sub.add_option("--shared-prefix", o.shared_prefix, "leading prompt tokens all requests share; runs with the prefix cache on and off")
      ->check(CLI::Range(0, 1 << 20));
  sub.add_option("--max-step-tokens", o.max_step, "token budget per engine step")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub.add_option("--device", o.device, "where the forward pass runs: cpu, or cuda:N (a GPU shard, in a build with CUDA)")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            if (s == "cpu") return "";
            auto index = cuda_device_index(s);
            return index ? "" : index.err().message + " (cpu or cuda:N)";
          },
          "cpu|cuda:N"))
      ->capture_default_str();
  sub.add_option("--weights", o.weights, "with cuda:N, the weights on the device")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}))
      ->capture_default_str();
  sub.add_option("--rounds", o.rounds,
                 "run the concurrency list this many times in turn, then print each level's median throughput and "
                 "its ratio to the first level's in the same round (on a machine whose speed drifts, a ratio is "
                 "only fair between neighbouring runs)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
}

int run_serve_command(const model& m, const tokenizer& tok, const serve_options& o, const decode_setup& d,
                      const perf_context& ctx) {
  std::optional<gpu_placement> on_gpu;
  if (o.device != "cpu") {
    on_gpu = gpu_placement{cuda_device_index(o.device).value(), dtype_named(o.weights).value()};
    std::fprintf(stderr, "troupe-perf: serving on %s: %s weights and the KV cache in device memory, greedy tokens chosen there\n",
                 o.device.c_str(), o.weights.c_str());
  }
  std::printf("%-34s %8s %10s %9s %9s %9s %9s %9s\n", "workload", "requests", "out tok/s", "TTFT p50", "TTFT p99",
              "TPOT p50", "TPOT p99", "ITL p99");
  // Every (concurrency, caching) workload once per round; one engine each.
  struct workload {
    int c;
    bool caching;
    std::string name;
    std::vector<double> rates;  // output tokens/s, one per round
  };
  std::vector<workload> loads;
  for (int c : o.concurrency)
    for (bool caching : o.shared_prefix > 0 ? std::vector<bool>{true, false} : std::vector<bool>{true})
      loads.push_back({c, caching,
                       "c=" + std::to_string(c) + (o.shared_prefix > 0 ? (caching ? " prefix cache on" : " prefix cache off") : ""),
                       {}});
  const auto run_one = [&](workload& l) {
    serve_workload w;
    w.concurrency = l.c;
    w.num_requests = o.requests > 0 ? o.requests : std::max(4, 2 * l.c);
    w.prompt_tokens = o.prompt_tokens;
    w.output_tokens = o.output_tokens;
    w.shared_prefix = o.shared_prefix;
    engine_config cfg;
    cfg.num_threads = ctx.threads;
    cfg.sched.max_step_tokens = o.max_step;
    cfg.sched.max_running = std::max(l.c, 1);
    cfg.sched.kv.prefix_caching = l.caching;
    cfg.spec = d.spec;
    cfg.draft = d.draft;
    cfg.heads = d.heads;
    // (Drafts take positions past the last token.)
    const int64_t per_request = (o.prompt_tokens + o.output_tokens + (d.spec.enabled() ? d.spec.k : 0) + 15) / 16;
    cfg.sched.kv.num_blocks = static_cast<uint32_t>(per_request * l.c + 16);
    std::unique_ptr<llm_engine> engine;
    if (on_gpu) {
      auto made = llm_engine::on_gpu(m, tok, cfg, *on_gpu);
      if (!made) {
        std::fprintf(stderr, "troupe-perf: %s\n", made.err().message.c_str());
        std::exit(1);
      }
      engine = std::move(*made);
    } else {
      engine = std::make_unique<llm_engine>(m, tok, cfg);
    }
    const auto r = run_serve(*engine, w, m.config.vocab_size, tok.bos_id());
    l.rates.push_back(r.output_tokens_per_s);
    std::printf("%-34s %8d %10.1f %7.0fms %7.0fms %7.1fms %7.1fms %7.1fms   mean TTFT %.0f ms, prompt tokens computed %llu\n",
                l.name.c_str(), w.num_requests, r.output_tokens_per_s, percentile(r.ttft_ms, 50),
                percentile(r.ttft_ms, 99), percentile(r.tpot_ms, 50), percentile(r.tpot_ms, 99),
                percentile(r.itl_ms, 99), mean(r.ttft_ms),
                static_cast<unsigned long long>(r.prompt_tokens_computed));
    std::fflush(stdout);
    keep(l.name + " output tok/s", r.output_tokens_per_s, "tok/s");
    keep(l.name + " TTFT p50", percentile(r.ttft_ms, 50), "ms");
    keep(l.name + " TTFT p99", percentile(r.ttft_ms, 99), "ms");
    keep(l.name + " TTFT mean", mean(r.ttft_ms), "ms");
    keep(l.name + " TPOT p50", percentile(r.tpot_ms, 50), "ms");
    keep(l.name + " TPOT p99", percentile(r.tpot_ms, 99), "ms");
    keep(l.name + " ITL p99", percentile(r.itl_ms, 99), "ms");
  };
  for (int round = 0; round < o.rounds; ++round) {
    if (o.rounds > 1) std::printf("round %d of %d\n", round + 1, o.rounds);
    for (auto& l : loads) run_one(l);
  }
  if (o.rounds > 1) {
    const workload& base = loads.front();
    std::printf("\n%d rounds: median output tok/s, and throughput against %s in the same round\n", o.rounds,
                base.name.c_str());
    for (const auto& l : loads) {
      std::vector<double> ratio(l.rates.size());
      for (size_t i = 0; i < ratio.size(); ++i) ratio[i] = l.rates[i] / base.rates[i];
      std::printf("%-34s %10.1f   median %.2fx:", l.name.c_str(), percentile(l.rates, 50), percentile(ratio, 50));
      for (double x : ratio) std::printf(" %.2f", x);
      std::printf("\n");
      keep(l.name + " output tok/s, median of rounds", percentile(l.rates, 50), "tok/s");
      keep(l.name + " throughput against " + base.name + ", median of rounds", percentile(ratio, 50), "x");
    }
  }
  return 0;
}

}  // namespace troupe::tools
