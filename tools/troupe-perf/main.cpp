// troupe-perf: measures the engine on this machine: memory bandwidth, GEMM kernels,
// single-stream decode, prefill, batched decode, the serving loop and GPU decode,
// printing a table (and JSON with --json) that BENCHMARKS.md quotes. Each subcommand is
// in a file of its own (commands.hpp).
#include <algorithm>
#include <cstdio>
#include <thread>

#include <CLI/CLI.hpp>

#include "tools/troupe-perf/commands.hpp"
#include "tools/troupe-perf/report.hpp"

using namespace troupe::tools;

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
  perf_context c;
  std::string json_path;
  app.add_option("-j,--threads", c.threads, "worker threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("-r,--runs", c.runs, "measured runs")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  bandwidth_command bandwidth;
  bandwidth.add(app);
  model_commands models;
  models.add(app);
  gemm_command gemm;
  gemm.add(app);
  attention_command attention;
  attention.add(app);
  channel_command channel;
  channel.add(app);
  CLI11_PARSE(app, argc, argv);
  if (c.threads == 0) c.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  const int status = channel.sub->parsed()     ? channel.run(c)
                     : bandwidth.sub->parsed() ? bandwidth.run(c)
                     : attention.sub->parsed() ? attention.run(c)
                     : gemm.sub->parsed()      ? gemm.run(c)
                                               : models.run(c);
  if (status == 0 && !json_path.empty() && !write_json(json_path)) {
    std::fprintf(stderr, "troupe-perf: %s: cannot write\n", json_path.c_str());
    return 1;
  }
  return status;
}
