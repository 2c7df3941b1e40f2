// planner: the deployments that serve a traffic profile within its latency targets, and
// what each costs. For every tensor and pipeline split the device memory allows, the
// rate one replica sustains within the targets (bisection over simulated Poisson
// traffic), the replicas the profile needs, the figures it then gets, and the price per
// million tokens; cheapest first.
#pragma once

#include <string>
#include <vector>

#include "tools/troupe-plan/simulate.hpp"

namespace troupe::plan {

struct targets {
  double ttft_p99_ms = 0;  // 0: none
  double tpot_p99_ms = 0;
  bool met_by(const prediction& p) const {
    return (ttft_p99_ms <= 0 || p.ttft_p99_ms <= ttft_p99_ms) && (tpot_p99_ms <= 0 || p.tpot_p99_ms <= tpot_p99_ms);
  }
};

// What a replica of a layout holds: weights and KV cache per device, and the requests of
// the profile's lengths its cache has room for.
struct memory_fit {
  double weights_gib = 0;      // per device, the largest stage's
  double kv_gib = 0;           // per device, what is left for the cache
  int64_t kv_tokens = 0;       // per replica
  double kv_per_request_mib = 0;  // one request of the profile's longest prompt + output
  int64_t max_concurrency = 0;    // such requests the cache holds at once
  std::string why_not;            // non-empty: the weights do not fit
};

memory_fit fit_memory(const model_cost& m, const hardware_profile& h, const layout& l, const traffic& t,
                      double memory_use = 0.9);

struct candidate {
  layout l;
  memory_fit memory;
  double replica_rate = 0;  // requests/s one replica sustains within the targets
  prediction p;             // at the profile's rate, with l.replicas
  double cost_per_m_output = 0;  // price per million output tokens
  double cost_per_m_total = 0;   // ... per million tokens, prompt and output
  std::string why_not;           // non-empty: not a deployment for this profile
};

struct plan_request {
  traffic load;  // rate > 0
  targets goal;
  scheduler_limits limits;
  int max_devices = 1024;
};

// Every layout considered (those that cannot serve say why), cheapest serving one first.
std::vector<candidate> plan_layouts(const model_cost& m, const model_config& c, const hardware_profile& h,
                            const plan_request& r);

// What a troupe-bench run calibrates: the serving path's cost per step, or (from a run of
// tensor shards) the latency of one all-reduce between them.
enum class fitted { step_overhead_ms, link_latency_us };

// The value of `what` that makes the simulated TPOT p50 of `l` under `t` equal
// `measured_tpot_ms` (the step overhead the same for every stage); 0 when the profile
// alone is up to 15% slower than the run; an error when no value in range fits.
expected<double> fit_to_tpot(const model_cost& m, hardware_profile h, const layout& l, const scheduler_limits& s,
                            const traffic& t, double measured_tpot_ms, fitted what);

}  // namespace troupe::plan
