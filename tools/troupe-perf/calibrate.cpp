#include "tools/troupe-perf/calibrate.hpp"

#include <unistd.h>

#include <fstream>
#include <thread>

#include "tools/troupe-plan/model_cost.hpp"

namespace troupe::tools {

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  return "this CPU";
}

}  // namespace

plan::hardware_profile calibrate(const model& m, int max_threads, const calibration_probes& probes) {
  plan::model_shape shape{m.path, m.config, m.weight_type, m.weight_type == dtype::f32 ? dtype::f32 : dtype::f16};
  const plan::model_cost cost = plan::cost_of(shape);
  const double token_flops = cost.layer_flops(cost.layers) + cost.classifier_flops();
  // A 128-token prompt: every row through the layers, attention over half the prompt on
  // average, the classifier for the last row only.
  const double prompt_flops = 128 * cost.layer_flops(cost.layers) + cost.attention_flops(cost.layers, 128.0 * 64.5) +
                              cost.classifier_flops();
  plan::hardware_profile h;
  h.kind = "cpu";
  h.name = cpu_model() + ", " + std::to_string(max_threads) + " cores";
  h.source = "measured by troupe-perf calibrate with " + m.path;
  h.memory_gib = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
                 (1024.0 * 1024 * 1024);
  h.devices_per_node = max_threads;
  std::vector<int> counts;
  for (int t = 1; t < max_threads; t *= 2) counts.push_back(t);
  counts.push_back(max_threads);
  for (int t : counts) {
    plan::rate_point r;
    r.threads = t;
    const std::string at = ", " + std::to_string(t) + (t == 1 ? " thread" : " threads");
    const double d1 = probes.decode_1(t);
    r.weight_gbs = d1 * cost.weight_bytes_total() / 1e9;
    probes.report("weights streamed (decode, 1 sequence)" + at, r.weight_gbs, "GB/s");
    r.decode_gflops = probes.decode_16(t) * token_flops / 1e9;
    probes.report("matrix rate (decode, 16 sequences)" + at, r.decode_gflops, "GFLOP/s");
    r.prefill_gflops = probes.prefill_128(t) / 128 * prompt_flops / 1e9;
    probes.report("matrix rate (prefill, 128 tokens)" + at, r.prefill_gflops, "GFLOP/s");
    r.kv_gbs = probes.read_gbs(t);
    probes.report("memory read" + at, r.kv_gbs, "GB/s");
    h.rates.push_back(r);
  }
  // Between the shards of one process: shared memory, a barrier per all-reduce. Between
  // processes: loopback TCP. The step overhead is the serving path's: troupe-plan fit
  // sets it from a troupe-bench run.
  h.link_gbs = h.rates.back().kv_gbs;
  h.link_latency_us = 5;
  h.net_gbs = 2;
  h.net_latency_us = 50;
  h.step_overhead_ms = 0;
  h.price_per_hour = 0.04;  // per core-hour, an indicative cloud vCPU rate
  return h;
}

}  // namespace troupe::tools
