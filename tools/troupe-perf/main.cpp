// troupe-perf: measures the engine on this machine: memory bandwidth, GEMM kernels,
// single-stream decode, prefill, and batched decode, printing a table (and JSON with
// --json) that BENCHMARKS.md quotes.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "engine/generate/generator.hpp"
#include "engine/forward/cuda_shard.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/gemm_w8a8.hpp"
#include "tools/troupe-perf/attention_bench.hpp"
#include "tools/troupe-perf/calibrate.hpp"
#include "tools/troupe-perf/channel_bench.hpp"
#include "tools/troupe-perf/eviction_bench.hpp"
#include "tools/common/eviction_cli.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/common/speculative_cli.hpp"
#include "tools/common/stats.hpp"
#include "tools/troupe-perf/gpu_bench.hpp"
#include "tools/troupe-perf/serve_bench.hpp"
#include "tools/troupe-perf/triad.hpp"

using namespace troupe;
using tools::median;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct row_out {
  std::string name;
  double value;
  std::string unit;
  std::string note;
};

std::vector<row_out> results;

void report(const std::string& name, double value, const std::string& unit, const std::string& note = "") {
  results.push_back({name, value, unit, note});
  std::printf("%-44s %12.1f %-8s %s\n", name.c_str(), value, unit.c_str(), note.c_str());
  std::fflush(stdout);
}

// Speculative decoding for decode and batch (none by default), and its last run's figures.
speculative_config spec;
const model* spec_draft = nullptr;
const speculative_heads* spec_heads = nullptr;
kv_eviction_config eviction;  // KV eviction for decode and batch (none by default)
engine_stats last_stats;

// Decodes `tokens` tokens for each of `sequences` sequences after a short prompt, in one
// batch, greedy; returns generated tokens per second (all sequences together), the
// median of `runs` runs.
double decode_rate(const model& m, const tokenizer& tok, int threads, int sequences, int tokens, int runs) {
  generator_options opts;
  opts.num_threads = threads;
  opts.spec = spec;
  opts.draft = spec_draft;
  opts.heads = spec_heads;
  opts.eviction = eviction;
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
    last_stats = gen.last_stats();
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "troupe-perf: measure the engine on this machine.\n\n"
      "  troupe-perf bandwidth                    memory bandwidth (STREAM-like triad and read)\n"
      "  troupe-perf decode MODEL                 single-stream decode tokens/s\n"
      "  troupe-perf prefill MODEL                prompt tokens/s for one prompt\n"
      "  troupe-perf batch MODEL -b 1,4,16,32     aggregate decode tokens/s per batch size\n"
      "  troupe-perf gemm --type q8_0             one weight matrix, tokens per step\n"
      "  troupe-perf gemm --tokens 16 --copies 100   the same with the weights from memory\n"
      "  troupe-perf attention -b 16 --context 200   decode attention alone: the cache's read rate\n"
      "  troupe-perf serve MODEL -c 1,4,16,64     the serving loop: throughput, TTFT, TPOT\n"
      "  troupe-perf serve MODEL --shared-prefix 400 ...   with and without prefix caching\n"
      "  troupe-perf eviction MODEL               KV eviction's quality: the full-cache perplexity of\n"
      "                                           each policy's generations, at 20% and 50% budgets\n"
      "  troupe-perf calibrate MODEL -o machine.json   this machine's rates for troupe-plan, 1 thread to all\n"
      "  troupe-perf gpu MODEL -b 1,8,64          GPU decode tokens/s and weight bandwidth per batch\n"
      "                                           size, against the device's copy bandwidth\n\n"
      "Every figure is the median of --runs runs after one warm-up run.\n\n"
      "Environment (for side-by-side runs): TROUPE_NO_W8A8=1 runs q8_0 weights with float\n"
      "activations, TROUPE_NO_AMX=1 keeps int8 activations off the AMX tiles,\n"
      "TROUPE_KV_TYPE=f32|f16|q8_0 sets the KV cache's type (q8_0: int8, a scale per token and\n"
      "KV head).",
      "troupe-perf"};
  app.require_subcommand(1);
  app.fallthrough();
  int threads = 0, runs = 3, tokens = 128, prompt_tokens = 128;
  std::string model_path, tokenizer_path, json_path;
  std::vector<int> batches{1, 4, 16, 32};
  app.add_option("-j,--threads", threads, "worker threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("-r,--runs", runs, "measured runs")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--json", json_path, "also write the results as JSON to this file");

  auto* bw = app.add_subcommand("bandwidth", "memory bandwidth");
  size_t mib = 512;
  bw->add_option("--mib", mib, "MiB per array (three arrays)")->check(CLI::Range(16, 8192))->capture_default_str();

  auto add_model = [&](CLI::App* sub) {
    sub->add_option("model", model_path, "checkpoint")->required();
    sub->add_option("-z,--tokenizer", tokenizer_path, "tokenizer.bin for llama2.c checkpoints");
  };
  auto* dec = app.add_subcommand("decode", "single-stream decode");
  add_model(dec);
  dec->add_option("-n,--tokens", tokens, "tokens to generate per run")->check(CLI::Range(2, 100000))->capture_default_str();
  tools::speculative_options spec_opts;
  tools::add_speculative_options(*dec, spec_opts);
  tools::eviction_options evict_opts;
  tools::add_eviction_options(*dec, evict_opts);
  auto* pre = app.add_subcommand("prefill", "prompt processing");
  add_model(pre);
  pre->add_option("-p,--prompt-tokens", prompt_tokens)->check(CLI::Range(2, 100000))->capture_default_str();
  auto* bat = app.add_subcommand("batch", "batched decode");
  add_model(bat);
  bat->add_option("-b,--batch", batches, "sequences per batch")->delimiter(',')->check(CLI::Range(1, 4096));
  bat->add_option("-n,--tokens", tokens, "tokens to generate per sequence")->check(CLI::Range(2, 100000))->capture_default_str();
  tools::add_speculative_options(*bat, spec_opts);
  tools::add_eviction_options(*bat, evict_opts);

  auto* evq = app.add_subcommand("eviction", "KV eviction's quality: the full-cache perplexity of each policy's generations");
  add_model(evq);
  tools::eviction_bench_options eq;
  evq->add_option("--texts", eq.texts, "seeded generations per row")->check(CLI::Range(1, 10000))->capture_default_str();
  evq->add_option("--length", eq.length, "tokens each generates (default: the context, less the prompt)")
      ->check(CLI::Range(0, 1 << 20));
  evq->add_option("--budgets", eq.budgets, "budgets, in percent of --length")->delimiter(',')->check(CLI::Range(1, 100));
  evq->add_option("--policies", eq.policies, "policies to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"streaming", "h2o", "scissorhands"}));
  evq->add_option("--long", eq.long_factor, "streaming runs this many contexts long, segment by segment (1: not at all)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  evq->add_option("-t,--temperature", eq.temperature)->check(CLI::Range(0.0f, 100.0f))->capture_default_str();

  auto* srv = app.add_subcommand("serve", "serving loop under concurrent requests");
  add_model(srv);
  tools::add_speculative_options(*srv, spec_opts);
  std::vector<int> concurrency{1, 4, 16, 64};
  int out_tokens = 128, num_requests = 0, shared_prefix = 0, max_step = 512;
  srv->add_option("-c,--concurrency", concurrency, "requests kept in flight")->delimiter(',')->check(CLI::Range(1, 4096));
  srv->add_option("-p,--prompt-tokens", prompt_tokens, "prompt length, BOS included")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  srv->add_option("-n,--output-tokens", out_tokens, "tokens generated per request")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  srv->add_option("--requests", num_requests, "requests per run (default: 2 x concurrency, at least 4)")->check(CLI::Range(0, 1 << 20));
  srv->add_option("--shared-prefix", shared_prefix, "leading prompt tokens all requests share; runs with the prefix cache on and off")
      ->check(CLI::Range(0, 1 << 20));
  srv->add_option("--max-step-tokens", max_step, "token budget per engine step")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  std::string serve_device = "cpu", serve_weights = "bf16";
  srv->add_option("--device", serve_device, "where the forward pass runs: cpu, or cuda:N (a GPU shard, in a build with CUDA)")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            if (s == "cpu") return "";
            auto index = cuda_device_index(s);
            return index ? "" : index.err().message + " (cpu or cuda:N)";
          },
          "cpu|cuda:N"))
      ->capture_default_str();
  srv->add_option("--weights", serve_weights, "with cuda:N, the weights on the device")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}))
      ->capture_default_str();
  int rounds = 1;
  srv->add_option("--rounds", rounds,
                  "run the concurrency list this many times in turn, then print each level's median throughput and "
                  "its ratio to the first level's in the same round (on a machine whose speed drifts, a ratio is "
                  "only fair between neighbouring runs)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();

  auto* cal = app.add_subcommand("calibrate", "this machine's rates as troupe-plan reads them (a profile file)");
  add_model(cal);
  std::string profile_path;
  cal->add_option("-o,--out", profile_path, "the profile to write")->required();

  auto* gpu = app.add_subcommand("gpu", "decode on a GPU shard (builds with CUDA)");
  add_model(gpu);
  int gpu_device = 0;
  std::string gpu_weights = "bf16";
  std::vector<int> gpu_batches{1, 8, 64};
  gpu->add_option("--device", gpu_device, "CUDA device index")->check(CLI::Range(0, 64))->capture_default_str();
  gpu->add_option("--weights", gpu_weights, "weights on the device")->check(CLI::IsMember({"bf16", "f16", "f32"}))->capture_default_str();
  gpu->add_option("-b,--batch", gpu_batches, "sequences per batch")->delimiter(',')->check(CLI::Range(1, 4096));
  gpu->add_option("-n,--tokens", tokens, "decode steps per run")->check(CLI::Range(2, 100000))->capture_default_str();
  std::vector<std::string> gpu_graphs{"on"};
  std::vector<int> gpu_gemv{1};
  bool gpu_logits = false;
  float gpu_temperature = 0.0f, gpu_top_p = 1.0f;
  int gpu_top_k = 0;
  gpu->add_option("--temperature", gpu_temperature, "0: greedy; otherwise each step draws at this temperature")
      ->check(CLI::Range(0.0f, 100.0f))->capture_default_str();
  gpu->add_option("--top-k", gpu_top_k, "with --temperature: keep the k most likely tokens (0: all)")
      ->check(CLI::Range(0, 1000000))->capture_default_str();
  gpu->add_option("--top-p", gpu_top_p, "with --temperature: keep the smallest set holding this mass")
      ->check(CLI::Range(1e-6f, 1.0f))->capture_default_str();
  gpu->add_flag("--logits-to-host", gpu_logits, "copy each step's logits to the host and choose there (default: chosen on the device)");
  gpu->add_option("--graphs", gpu_graphs, "decode steps as CUDA graphs: on, off, or on,off to measure both")
      ->delimiter(',')->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  gpu->add_option("--gemv-rows", gpu_gemv, "troupe's GEMV for batches up to this many sequences, 0 to 8 (0: cuBLAS only); a list measures each")
      ->delimiter(',')->check(CLI::Range(0, 8))->capture_default_str();

  auto* gm = app.add_subcommand("gemm", "one GEMM");
  std::string type_name = "q8_0";
  int rows = 2048, cols = 768, m_tokens = 1;
  gm->add_option("--type", type_name)->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}))->capture_default_str();
  gm->add_option("--rows", rows)->check(CLI::Range(1, 1 << 20))->capture_default_str();
  gm->add_option("--cols", cols)->check(CLI::Range(32, 1 << 20))->capture_default_str();
  gm->add_option("--tokens", m_tokens)->check(CLI::Range(1, 4096))->capture_default_str();
  int copies = 1;
  gm->add_option("--copies", copies,
                 "copies of the matrix, taken in turn: enough that together they outgrow the caches reads "
                 "the weights from memory, as a model's forward pass does")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  auto* att = app.add_subcommand("attention", "decode-step attention alone, over a cache scattered in blocks");
  tools::attention_shape ash;
  std::string cache_name = "f16";
  att->add_option("-b,--sequences", ash.sequences, "sequences, one token each")->check(CLI::Range(1, 4096))->capture_default_str();
  att->add_option("--context", ash.context, "positions each attends to")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  att->add_option("--layers", ash.layers)->check(CLI::Range(1, 1024))->capture_default_str();
  att->add_option("--heads", ash.heads, "query heads")->check(CLI::Range(1, 1024))->capture_default_str();
  att->add_option("--kv-heads", ash.kv_heads, "KV heads (dividing --heads)")->check(CLI::Range(1, 1024))->capture_default_str();
  att->add_option("--head-dim", ash.head_dim)->check(CLI::Range(1, 1024))->capture_default_str();
  att->add_option("--cache", cache_name, "the cache's type (q8_0: int8, a scale per token and KV head)")
      ->check(CLI::IsMember({"f32", "f16", "q8_0"}))->capture_default_str();
  auto* chn = app.add_subcommand("channel", "the KV channel on loopback beside raw TCP, the same bytes alternated");
  tools::channel_bench_options cho;
  chn->add_option("--mib", cho.total_mib, "MiB moved per measurement")->check(CLI::Range(1, 65536))->capture_default_str();
  chn->add_option("--block-kib", cho.block_kib, "KiB per record (one KV block)")->check(CLI::Range(1, 65536))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  if (chn->parsed()) {
    const auto c = tools::measure_channel(cho, runs);
    char note[64];
    std::snprintf(note, sizeof note, "%.2fx raw TCP (%.2f GB/s)", c.channel_gbs / c.raw_gbs, c.raw_gbs);
    report("kv channel, loopback, " + std::to_string(cho.block_kib) + " KiB records", c.channel_gbs, "GB/s", note);
  } else if (bw->parsed()) {
    thread_pool pool(threads);
    auto b = tools::measure_bandwidth(pool, mib << 20, runs);
    report("triad bandwidth, " + std::to_string(threads) + " threads", b.triad_gbs, "GB/s");
    report("read bandwidth, " + std::to_string(threads) + " threads", b.read_gbs, "GB/s");
  } else if (att->parsed()) {
    if (ash.heads % ash.kv_heads != 0) {
      std::fprintf(stderr, "troupe-perf: --kv-heads %d does not divide --heads %d\n", ash.kv_heads, ash.heads);
      return 1;
    }
    ash.cache = dtype_named(cache_name).value();  // (--cache takes only f32, f16, q8_0)
    const double cache_bytes = 2.0 * ash.sequences * ash.context * ash.layers * ash.kv_heads * ash.head_dim *
                               (ash.cache == dtype::f32 ? 4 : ash.cache == dtype::f16 ? 2 : 1);
    if (cache_bytes > 64e9) {
      std::fprintf(stderr, "troupe-perf: that cache would hold %.0f GB; ask for less\n", cache_bytes / 1e9);
      return 1;
    }
    std::fprintf(stderr, "troupe-perf: writing a %.0f MB cache\n", cache_bytes / 1e6);
    thread_pool pool(threads);
    const auto a = tools::measure_attention(ash, pool, runs);
    char note[96];
    std::snprintf(note, sizeof note, "%.2f ms per step of %d layers (%.0f MB read)", a.step_ms, ash.layers, a.cache_mb);
    report("attention, " + std::to_string(ash.sequences) + " x " + std::to_string(ash.context) + " positions, " +
               cache_name + " cache, " + std::to_string(threads) + " threads",
           a.cache_gbs, "GB/s", note);
  } else if (gm->parsed()) {
    const dtype type = dtype_named(type_name).value();  // (--type takes only these names)
    cols = cols / 32 * 32;
    const double copy_bytes = double(rows) * cols * 4 * copies;
    if (copy_bytes > 16e9) {
      std::fprintf(stderr, "troupe-perf: %d copies would hold %.0f GB; ask for fewer\n", copies, copy_bytes / 1e9);
      return 1;
    }
    // Distinct buffers of the same bytes, and (q8_0) their packed forms, as a shard runs
    // them where the CPU has the int8 kernels.
    std::vector<std::vector<uint8_t>> bufs(copies, std::vector<uint8_t>(int64_t{rows} * cols * 4 + 64, 1));
    std::vector<matrix_view> ws(copies);
    std::vector<q8_packed> packed(copies);
    for (int c = 0; c < copies; ++c) {
      matrix_view& w = ws[c];
      if (type == dtype::q8_0) {
        w.type = type;
        w.rows = rows;
        w.cols = cols;
        w.group_size = 32;
        w.q_row_stride = cols / 32 * 34;
        w.q_group_stride = 34;
        w.q = reinterpret_cast<const int8_t*>(bufs[c].data() + 2);
        w.scale = bufs[c].data();
        w.s_row_stride = w.q_row_stride;
        w.s_group_stride = 34;
        w.scale_is_f16 = true;
      } else {
        w = matrix_view::dense(type, bufs[c].data(), rows, cols);
      }
      if (w8a8_kernel_in_use() && w8a8_layout(w)) {
        packed[c] = pack_q8(w);
        w.packed = &packed[c];
      }
    }
    std::vector<float> x(int64_t{m_tokens} * cols, 0.5f), y(int64_t{m_tokens} * rows);
    thread_pool pool(threads);
    std::vector<double> t;
    for (int r = 0; r < runs + 1; ++r) {
      auto t0 = clock_type::now();
      int iters = 0;
      do {
        gemm(x.data(), cols, m_tokens, ws[iters % copies], y.data(), rows, pool);
        ++iters;
      } while (seconds_since(t0) < 0.2 || iters < copies);
      if (r > 0) t.push_back(seconds_since(t0) / iters);
    }
    const matrix_view& w = ws[0];
    const double s = median(t);
    report("gemm " + type_name + " " + std::to_string(rows) + "x" + std::to_string(cols) + " x " + std::to_string(m_tokens) + " tokens" +
               (copies > 1 ? ", " + std::to_string(copies) + " copies" : ""),
           2.0 * rows * cols * m_tokens / s / 1e9, "GFLOP/s", std::to_string(w.bytes() / s / 1e9) + " GB/s of weights");
  } else {
    auto loaded = tools::load_model_and_tokenizer(model_path, tokenizer_path);
    if (!loaded) {
      std::fprintf(stderr, "troupe-perf: %s\n", loaded.err().message.c_str());
      return 1;
    }
    const model& m = loaded->m;
    const tokenizer& tok = *loaded->tok;
    const bool on_device = gpu->parsed() || (srv->parsed() && serve_device != "cpu");
    if (on_device)  // (the device and its weights are named below)
      std::fprintf(stderr, "troupe-perf: %s: %s, %s\n", m.path.c_str(), m.format.c_str(), describe(m.config).c_str());
    else
      std::fprintf(stderr, "troupe-perf: %s: %s, %s, %d threads; %s\n", m.path.c_str(), m.format.c_str(),
                   describe(m.config).c_str(), threads, transformer_shard::cpu_kernels(m).c_str());
    const double bytes = static_cast<double>(m.weights.streamed_bytes());
    static tools::speculative_models spec_models;  // (outlives the runs that use it)
    auto sc = tools::speculative_from(spec_opts, m, m.vocab ? &*m.vocab : nullptr, spec_models);
    const std::optional<model>& draft = spec_models.draft;
    if (!sc) {
      std::fprintf(stderr, "troupe-perf: %s\n", sc.err().message.c_str());
      return 1;
    }
    spec = *sc;
    spec_draft = draft ? &*draft : nullptr;
    spec_heads = spec_models.heads.get();
    auto ec = tools::eviction_config_of(evict_opts, m.config);
    if (!ec) {
      std::fprintf(stderr, "troupe-perf: %s\n", ec.err().message.c_str());
      return 1;
    }
    eviction = *ec;
    if (evq->parsed()) {
      eq.threads = threads;
      tools::run_eviction_bench(m, tok, eq);
      return 0;
    }
    // The speculative figures of the last run, after a decode row.
    std::string spec_name = spec.enabled() ? ", speculative " + std::string(spec_method_name(spec.method)) + ", " + spec.drafts_text() : "";
    if (eviction.enabled())
      spec_name += ", KV " + std::string(kv_policy_name(eviction.policy)) + " budget " + std::to_string(eviction.budget);
    auto spec_note = [&]() -> std::string {
      if (!spec.enabled() || last_stats.spec.verifies == 0) return "";
      char buf[128];
      std::snprintf(buf, sizeof buf, "; %.0f%% of drafts accepted, %.2f tokens per verify",
                    100.0 * static_cast<double>(last_stats.spec.accepted) / static_cast<double>(std::max<uint64_t>(last_stats.spec.proposed, 1)),
                    1.0 + static_cast<double>(last_stats.spec.accepted) / static_cast<double>(last_stats.spec.verifies));
      return buf;
    };
    if (gpu->parsed()) {
      bool copy_reported = false;
      const std::string choice = gpu_temperature == 0.0f ? "greedy" : "sampled (temperature " + std::to_string(gpu_temperature).substr(0, 4) + ")";
      std::fprintf(stderr, "troupe-perf: tokens %s %s\n", choice.c_str(), gpu_logits ? "on the host" : "on the device");
      for (const std::string& graphs : gpu_graphs)
        for (const int gemv : gpu_gemv) {
          const tools::gpu_bench_options go{gpu_device, gpu_weights, graphs == "on", gemv, gpu_logits,
                                            truncation{gpu_temperature, gpu_top_k, gpu_top_p, 0.0f}};
          auto rep = tools::measure_gpu(m, go, gpu_batches, tokens, runs);
          if (!rep) {
            std::fprintf(stderr, "troupe-perf: %s\n", rep.err().message.c_str());
            return 1;
          }
          if (!std::exchange(copy_reported, true)) report("device-to-device copy, " + rep->device, rep->copy_gbs, "GB/s");
          for (const auto& d : rep->decode)
            report("GPU decode, batch " + std::to_string(d.batch) + ", " + gpu_weights + ", graphs " + graphs + ", gemv rows " + std::to_string(gemv),
                   d.tokens_per_s, "tok/s",
                   std::to_string(d.weight_gbs).substr(0, 6) + " GB/s of weights (" +
                       std::to_string(100.0 * d.weight_gbs / rep->copy_gbs).substr(0, 4) + "% of the copy)");
        }
      return 0;
    }
    if (cal->parsed()) {
      tools::calibration_probes probes;
      probes.decode_1 = [&](int t) { return decode_rate(m, tok, t, 1, tokens, runs); };
      probes.decode_16 = [&](int t) { return decode_rate(m, tok, t, 16, 32, runs); };
      probes.prefill_128 = [&](int t) { return prefill_rate(m, tok, t, 128, runs); };
      probes.read_gbs = [&](int t) {
        thread_pool pool(t);
        return tools::measure_bandwidth(pool, size_t{512} << 20, runs).read_gbs;
      };
      probes.report = [](const std::string& what, double v, const std::string& unit) { report(what, v, unit); };
      const plan::hardware_profile h = tools::calibrate(m, threads, probes);
      std::ofstream f(profile_path);
      f << plan::profile_to_json(h);
      if (!f) {
        std::fprintf(stderr, "troupe-perf: %s: cannot write\n", profile_path.c_str());
        return 1;
      }
      std::fprintf(stderr, "troupe-perf: wrote %s (%s)\n", profile_path.c_str(), h.name.c_str());
    } else if (dec->parsed()) {
      const double r = decode_rate(m, tok, threads, 1, tokens, runs);
      const std::string note = spec_note();
      report("decode, 1 sequence, " + std::to_string(threads) + " threads" + spec_name, r, "tok/s",
             note.empty() ? std::to_string(r * bytes / 1e9).substr(0, 5) + " GB/s of weights" : note.substr(2));
    } else if (pre->parsed()) {
      report("prefill, " + std::to_string(prompt_tokens) + " tokens, " + std::to_string(threads) + " threads",
             prefill_rate(m, tok, threads, prompt_tokens, runs), "tok/s");
    } else if (srv->parsed()) {
      std::optional<gpu_placement> on_gpu;
      if (serve_device != "cpu") {
        on_gpu = gpu_placement{cuda_device_index(serve_device).value(), dtype_named(serve_weights).value()};
        std::fprintf(stderr, "troupe-perf: serving on %s: %s weights and the KV cache in device memory, greedy tokens chosen there\n",
                     serve_device.c_str(), serve_weights.c_str());
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
      for (int c : concurrency)
        for (bool caching : shared_prefix > 0 ? std::vector<bool>{true, false} : std::vector<bool>{true})
          loads.push_back({c, caching,
                           "c=" + std::to_string(c) + (shared_prefix > 0 ? (caching ? " prefix cache on" : " prefix cache off") : ""),
                           {}});
      const auto run_one = [&](workload& l) {
        tools::serve_workload w;
        w.concurrency = l.c;
        w.num_requests = num_requests > 0 ? num_requests : std::max(4, 2 * l.c);
        w.prompt_tokens = prompt_tokens;
        w.output_tokens = out_tokens;
        w.shared_prefix = shared_prefix;
        engine_config cfg;
        cfg.num_threads = threads;
        cfg.sched.max_step_tokens = max_step;
        cfg.sched.max_running = std::max(l.c, 1);
        cfg.sched.kv.prefix_caching = l.caching;
        cfg.spec = spec;
        cfg.draft = spec_draft;
        cfg.heads = spec_heads;
        // (Drafts take positions past the last token.)
        const int64_t per_request = (prompt_tokens + out_tokens + (spec.enabled() ? spec.k : 0) + 15) / 16;
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
        const auto r = tools::run_serve(*engine, w, m.config.vocab_size, tok.bos_id());
        l.rates.push_back(r.output_tokens_per_s);
        std::printf("%-34s %8d %10.1f %7.0fms %7.0fms %7.1fms %7.1fms %7.1fms   mean TTFT %.0f ms, prompt tokens computed %llu\n",
                    l.name.c_str(), w.num_requests, r.output_tokens_per_s, tools::percentile(r.ttft_ms, 50),
                    tools::percentile(r.ttft_ms, 99), tools::percentile(r.tpot_ms, 50), tools::percentile(r.tpot_ms, 99),
                    tools::percentile(r.itl_ms, 99), tools::mean(r.ttft_ms),
                    static_cast<unsigned long long>(r.prompt_tokens_computed));
        std::fflush(stdout);
        results.push_back({l.name + " output tok/s", r.output_tokens_per_s, "tok/s", ""});
        results.push_back({l.name + " TTFT p50", tools::percentile(r.ttft_ms, 50), "ms", ""});
        results.push_back({l.name + " TTFT p99", tools::percentile(r.ttft_ms, 99), "ms", ""});
        results.push_back({l.name + " TTFT mean", tools::mean(r.ttft_ms), "ms", ""});
        results.push_back({l.name + " TPOT p50", tools::percentile(r.tpot_ms, 50), "ms", ""});
        results.push_back({l.name + " TPOT p99", tools::percentile(r.tpot_ms, 99), "ms", ""});
        results.push_back({l.name + " ITL p99", tools::percentile(r.itl_ms, 99), "ms", ""});
      };
      for (int round = 0; round < rounds; ++round) {
        if (rounds > 1) std::printf("round %d of %d\n", round + 1, rounds);
        for (auto& l : loads) run_one(l);
      }
      if (rounds > 1) {
        const workload& base = loads.front();
        std::printf("\n%d rounds: median output tok/s, and throughput against %s in the same round\n", rounds,
                    base.name.c_str());
        for (const auto& l : loads) {
          std::vector<double> ratio(l.rates.size());
          for (size_t i = 0; i < ratio.size(); ++i) ratio[i] = l.rates[i] / base.rates[i];
          std::printf("%-34s %10.1f   median %.2fx:", l.name.c_str(), tools::percentile(l.rates, 50), tools::percentile(ratio, 50));
          for (double x : ratio) std::printf(" %.2f", x);
          std::printf("\n");
          results.push_back({l.name + " output tok/s, median of rounds", tools::percentile(l.rates, 50), "tok/s", ""});
          results.push_back({l.name + " throughput against " + base.name + ", median of rounds", tools::percentile(ratio, 50), "x", ""});
        }
      }
    } else if (bat->parsed()) {
      for (int b : batches) {
        const double r = decode_rate(m, tok, threads, b, tokens, runs);
        report("decode, " + std::to_string(b) + " sequences, " + std::to_string(threads) + " threads" + spec_name, r, "tok/s",
               "all sequences together" + spec_note());
      }
    }
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << "[\n";
    for (size_t i = 0; i < results.size(); ++i)
      f << "  {\"name\": \"" << results[i].name << "\", \"value\": " << results[i].value << ", \"unit\": \""
        << results[i].unit << "\"}" << (i + 1 < results.size() ? ",\n" : "\n");
    f << "]\n";
  }
  return 0;
}
