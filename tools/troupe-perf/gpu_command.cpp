// troupe-perf gpu: decode on a GPU shard (gpu_bench.hpp) per batch size, with CUDA graphs
// and the GEMV on or off, beside the device's copy bandwidth.
#include <cstdio>
#include <utility>

#include "tools/troupe-perf/commands.hpp"
#include "tools/troupe-perf/gpu_bench.hpp"
#include "tools/troupe-perf/report.hpp"

namespace troupe::tools {

void add_gpu_options(CLI::App& sub, gpu_options& o) {
  sub.add_option("--device", o.device, "CUDA device index")->check(CLI::Range(0, 64))->capture_default_str();
  sub.add_option("--weights", o.weights, "weights on the device")->check(CLI::IsMember({"bf16", "f16", "f32"}))->capture_default_str();
  sub.add_option("-b,--batch", o.batches, "sequences per batch")->delimiter(',')->check(CLI::Range(1, 4096));
  sub.add_option("-n,--tokens", o.tokens, "decode steps per run")->check(CLI::Range(2, 100000))->capture_default_str();
  sub.add_option("--temperature", o.temperature, "0: greedy; otherwise each step draws at this temperature")
      ->check(CLI::Range(0.0f, 100.0f))
      ->capture_default_str();
  sub.add_option("--top-k", o.top_k, "with --temperature: keep the k most likely tokens (0: all)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  sub.add_option("--top-p", o.top_p, "with --temperature: keep the smallest set holding this mass")
      ->check(CLI::Range(1e-6f, 1.0f))
      ->capture_default_str();
  sub.add_flag("--logits-to-host", o.logits_to_host,
               "copy each step's logits to the host and choose there (default: chosen on the device)");
  sub.add_option("--graphs", o.graphs, "decode steps as CUDA graphs: on, off, or on,off to measure both")
      ->delimiter(',')
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub.add_option("--gemv-rows", o.gemv,
                 "troupe's GEMV for batches up to this many sequences, 0 to 8 (0: cuBLAS only); a list measures each")
      ->delimiter(',')
      ->check(CLI::Range(0, 8))
      ->capture_default_str();
}

int run_gpu_command(const model& m, const gpu_options& o, const perf_context& c) {
  bool copy_reported = false;
  const std::string choice =
      o.temperature == 0.0f ? "greedy" : "sampled (temperature " + std::to_string(o.temperature).substr(0, 4) + ")";
  std::fprintf(stderr, "troupe-perf: tokens %s %s\n", choice.c_str(), o.logits_to_host ? "on the host" : "on the device");
  for (const std::string& graphs : o.graphs)
    for (const int gemv : o.gemv) {
      const gpu_bench_options go{o.device, o.weights, graphs == "on", gemv, o.logits_to_host,
                                 truncation{o.temperature, o.top_k, o.top_p, 0.0f}};
      auto rep = measure_gpu(m, go, o.batches, o.tokens, c.runs);
      if (!rep) {
        std::fprintf(stderr, "troupe-perf: %s\n", rep.err().message.c_str());
        return 1;
      }
      if (!std::exchange(copy_reported, true)) report("device-to-device copy, " + rep->device, rep->copy_gbs, "GB/s");
      for (const auto& d : rep->decode)
        report("GPU decode, batch " + std::to_string(d.batch) + ", " + o.weights + ", graphs " + graphs + ", gemv rows " +
                   std::to_string(gemv),
               d.tokens_per_s, "tok/s",
               std::to_string(d.weight_gbs).substr(0, 6) + " GB/s of weights (" +
                   std::to_string(100.0 * d.weight_gbs / rep->copy_gbs).substr(0, 4) + "% of the copy)");
    }
  return 0;
}

}  // namespace troupe::tools
