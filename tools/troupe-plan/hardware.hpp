// hardware: what a device does per second, as the planner's roofline reads it. A table of
// common GPUs from their datasheets (with stated efficiencies), and profiles of a machine
// measured by `troupe-perf calibrate` (JSON files), where a CPU "device" is one core.
#pragma once

#include <string>
#include <vector>

#include "engine/util/expected.hpp"

namespace troupe::plan {

// One shard's rates with `threads` cores (a CPU) or on one device (a GPU).
struct rate_point {
  int threads = 1;
  double weight_gbs = 0;      // weights streamed per second by a batch-1 decode step
  double kv_gbs = 0;          // the KV cache read by attention
  double decode_gflops = 0;   // matrix arithmetic at decode batches (16 rows)
  double prefill_gflops = 0;  // ... at prompt chunks (128 rows and more)
  double step_overhead_ms = -1;  // the serving path's cost per step with this many threads
                                 // per node (troupe-plan fit); below 0: the profile's
};

struct hardware_profile {
  std::string name;
  std::string kind = "gpu";  // "gpu" or "cpu"
  std::string source;        // where the figures come from, in words
  double memory_gib = 0;     // per device (a CPU: the machine's, shared by its cores)
  int devices_per_node = 8;  // GPUs per node; a CPU's cores
  std::vector<rate_point> rates;  // by threads, ascending (a GPU: one point)
  double link_gbs = 0;            // between the shards of one stage (NVLink; shared memory)
  double link_latency_us = 0;     // per all-reduce
  double net_gbs = 0;             // between pipeline stages on different nodes
  double net_latency_us = 0;      // per hop
  double step_overhead_ms = 0;    // per step: planning, launches, the serving path (where
                                  // the rate point has none of its own)
  double price_per_hour = 0;      // per device (a CPU: per core)

  bool cpu() const { return kind == "cpu"; }
  // The rates of a shard with `threads` cores: the measured point, else the nearest one
  // below scaled by the ratio of threads (the first point, unscaled, below it).
  rate_point rates_for(int threads) const;
  double step_overhead_for(int threads) const;
};

// The datasheet table: h100, h200, a100, l40s, l4, a10g.
expected<hardware_profile> gpu_named(const std::string& name);
std::vector<std::string> gpu_names();

// A profile file as `troupe-perf calibrate` writes it; every field checked.
expected<hardware_profile> read_profile(const std::string& path);
expected<hardware_profile> profile_from_json(const std::string& text, const std::string& where);
std::string profile_to_json(const hardware_profile& h);

}  // namespace troupe::plan
