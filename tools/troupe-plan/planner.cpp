#include "tools/troupe-plan/planner.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace troupe::plan {

namespace {

constexpr double gib = 1024.0 * 1024 * 1024;

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << v;
  return os.str();
}

// Tensor splits a stage's heads allow: powers of two up to a node's devices.
std::vector<int> tensor_splits(const model_config& c, const hardware_profile& h) {
  std::vector<int> out;
  for (int tp = 1; tp <= h.devices_per_node; tp *= 2)
    if (c.num_heads % tp == 0 && c.num_kv_heads % tp == 0 && c.hidden_dim % tp == 0) out.push_back(tp);
  return out;
}

// The highest Poisson rate one replica serves within the goal: bisection between a rate
// it meets and one it misses (or cannot keep up with).
double replica_rate(const model_cost& m, const hardware_profile& h, layout l, const plan_request& r) {
  l.replicas = 1;
  traffic t = r.load;
  auto meets = [&](double rate) {
    t.rate = rate;
    const prediction p = simulate(m, h, l, r.limits, t);
    // Keeping up: the run ends near when its arrivals do (not a growing queue).
    const double arrivals = t.requests / rate;
    return p.completed == t.requests && r.goal.met_by(p) && p.seconds < arrivals * 1.25 + 1e-3 * p.ttft_p99_ms +
                                                                             1e-3 * p.tpot_p99_ms * t.output.max;
  };
  // An upper bound: the closed-loop throughput at the scheduler's limit.
  traffic closed = r.load;
  closed.rate = 0;
  closed.concurrency = r.limits.max_running;
  const prediction full = simulate(m, h, l, r.limits, closed);
  double hi = std::max(1e-6, full.requests_per_s * 1.5), lo = hi * 1e-3;
  if (!meets(lo)) return 0;
  for (int i = 0; i < 14 && hi / lo > 1.02; ++i) {
    const double mid = std::sqrt(lo * hi);
    (meets(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

memory_fit fit_memory(const model_cost& m, const hardware_profile& h, const layout& l, const traffic& t,
                      double memory_use) {
  memory_fit f;
  // A CPU's cores share the machine's memory: a shard of `threads` cores has their part.
  const double device_bytes =
      h.cpu() ? h.memory_gib * gib * l.threads / h.devices_per_node : h.memory_gib * gib;
  int64_t tokens = -1;
  for (int s = 0; s < l.pp; ++s) {
    const int32_t layers = stage_layers(m.layers, l.pp, s);
    const double weights = (layers * m.layer_bytes + (s == l.pp - 1 ? m.classifier_bytes : 0)) / l.tp;
    f.weights_gib = std::max(f.weights_gib, weights / gib);
    const double free = device_bytes * memory_use - weights;
    if (free <= 0) {
      f.why_not = "weights need " + fixed(weights / gib, 1) + " GiB per device, above " +
                  fixed(device_bytes * memory_use / gib, 1) + " GiB usable";
      return f;
    }
    const double per_token = m.kv_token_layer_bytes * layers / l.tp;
    const int64_t stage_tokens = static_cast<int64_t>(free / per_token);
    tokens = tokens < 0 ? stage_tokens : std::min(tokens, stage_tokens);
    f.kv_gib = s == 0 ? free / gib : std::min(f.kv_gib, free / gib);
  }
  f.kv_tokens = tokens;
  const int64_t longest = int64_t{t.prompt.max} + t.output.max;
  f.kv_per_request_mib = longest * m.kv_bytes_per_token() / (1024.0 * 1024);
  f.max_concurrency = longest > 0 ? tokens / longest : 0;
  if (f.max_concurrency == 0) f.why_not = "the KV cache left beside the weights holds no request of this length";
  return f;
}

std::vector<candidate> plan_layouts(const model_cost& m, const model_config& c, const hardware_profile& h,
                            const plan_request& r) {
  std::vector<candidate> out;
  const std::vector<int> thread_counts = h.cpu() ? std::vector<int>{1, 2, 4, 8, 16, 32, 64} : std::vector<int>{1};
  for (int tp : tensor_splits(c, h))
    for (int pp = 1; pp <= std::min(16, c.num_layers); pp *= 2)
      for (int threads : thread_counts) {
        if (tp * threads > h.devices_per_node || tp * pp * threads > r.max_devices) continue;
        candidate k;
        k.l = {tp, pp, 1, threads};
        k.memory = fit_memory(m, h, k.l, r.load);
        if (!k.memory.why_not.empty()) {
          k.why_not = k.memory.why_not;
          out.push_back(k);
          continue;
        }
        scheduler_limits limits = r.limits;
        limits.kv_tokens = limits.kv_tokens > 0 ? std::min(limits.kv_tokens, k.memory.kv_tokens) : k.memory.kv_tokens;
        plan_request here = r;
        here.limits = limits;
        k.replica_rate = replica_rate(m, h, k.l, here);
        if (k.replica_rate <= 0) {
          k.why_not = "one replica misses the targets even at a trickle of requests";
          out.push_back(k);
          continue;
        }
        k.l.replicas = static_cast<int>(std::ceil(r.load.rate / k.replica_rate - 1e-9));
        if (k.l.devices() > r.max_devices) {
          k.why_not = std::to_string(k.l.replicas) + " replicas need " + std::to_string(k.l.devices()) +
                      " devices, above --max-devices";
          out.push_back(k);
          continue;
        }
        k.p = simulate(m, h, k.l, limits, r.load);
        const double hours_per_token = 1.0 / 3600 / std::max(1e-12, r.load.rate * r.load.output.mean());
        k.cost_per_m_output = k.l.devices() * h.price_per_hour * hours_per_token * 1e6;
        k.cost_per_m_total =
            k.cost_per_m_output * r.load.output.mean() / (r.load.output.mean() + r.load.prompt.mean());
        out.push_back(k);
      }
  std::stable_sort(out.begin(), out.end(), [](const candidate& a, const candidate& b) {
    if (a.why_not.empty() != b.why_not.empty()) return a.why_not.empty();
    if (a.cost_per_m_output != b.cost_per_m_output) return a.cost_per_m_output < b.cost_per_m_output;
    return a.p.ttft_p99_ms < b.p.ttft_p99_ms;
  });
  return out;
}

expected<double> fit_to_tpot(const model_cost& m, hardware_profile h, const layout& l, const scheduler_limits& s,
                            const traffic& t, double measured_tpot_ms, fitted what) {
  const bool overhead = what == fitted::step_overhead_ms;
  auto tpot = [&](double v) {
    if (overhead) {
      h.step_overhead_ms = v;
      for (rate_point& r : h.rates) r.step_overhead_ms = -1;
    } else {
      h.link_latency_us = v;
    }
    return simulate(m, h, l, s, t).tpot_p50_ms;
  };
  double lo = 0, hi = overhead ? 1000 : 1e6;
  // A run a little faster than the model at 0 (the machine's speed drifts between the
  // calibration and the run) fits 0; much faster, the profile is wrong.
  const double floor = tpot(lo);
  if (floor > measured_tpot_ms && floor <= measured_tpot_ms * 1.15) return 0.0;
  if (floor > measured_tpot_ms)
    return error{"the profile alone predicts a TPOT p50 of " + fixed(floor, 2) + " ms, above the measured " +
                 fixed(measured_tpot_ms, 2) + " ms: its rates are too low for this run"};
  if (tpot(hi) < measured_tpot_ms)
    return error{std::string("no ") + (overhead ? "step overhead up to 1000 ms" : "all-reduce latency up to 1 s") +
                 " reaches the measured TPOT"};
  for (int i = 0; i < 40; ++i) {
    const double mid = 0.5 * (lo + hi);
    (tpot(mid) < measured_tpot_ms ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

}  // namespace troupe::plan
