// troupe-plan's work once its flags are read: the model, the hardware and the layouts
// settled, then a profile fitted to a troupe-bench run, given layouts predicted, or the
// cheapest layouts planned.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/troupe-plan/planner.hpp"

namespace troupe::plan {

struct plan_options {
  std::string model_path, shape, weights_name, kv_name, hardware = "h100", prompt = "512", output = "256", json_path;
  std::vector<std::string> layouts;
  double price = -1, rate = 0, ttft = 0, tpot = 0;
  int concurrency = 0, requests = 200, max_devices = 1024;
  uint64_t seed = 1;
  scheduler_limits limits;
  int64_t kv_tokens = 0;
  std::string bench_path, out_path;  // fit
};

// What the flags name: the model's shape and cost, the hardware, the given layouts.
struct plan_setup {
  model_shape ms;
  model_cost cost;
  hardware_profile hw;
  std::vector<layout> given;
};

// The setup, printed (model and hardware lines); a mistake ends the process with status 2
// and the reason on stderr.
plan_setup settle(const plan_options& o);

// fit: the profile's step overhead (or, with tensor shards, its all-reduce latency) fitted
// to a troupe-bench run of the one given layout, written to --out. The exit status.
int fit_profile(const plan_options& o, plan_setup& setup);

// The given layouts predicted under the traffic, or the cheapest layouts planned for it;
// with --json, the results there too. The exit status: 1 when no layout serves.
int predict_or_plan(const plan_options& o, const plan_setup& setup);

}  // namespace troupe::plan
