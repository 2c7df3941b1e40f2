// troupe-perf calibrate: this machine as troupe-plan reads it. For 1 thread up to all of
// them, the rates a shard reaches with the model named: weights streamed by a batch-1
// decode step, the matrix rate of a 16-sequence decode step and of a 128-token prompt,
// and the memory's read rate (what attention reads the cache at).
#pragma once

#include <functional>
#include <string>

#include "engine/model/model.hpp"
#include "tools/troupe-plan/hardware.hpp"

namespace troupe::tools {

struct calibration_probes {
  std::function<double(int threads)> decode_1;    // tokens/s, one sequence
  std::function<double(int threads)> decode_16;   // tokens/s, 16 sequences together
  std::function<double(int threads)> prefill_128; // prompt tokens/s
  std::function<double(int threads)> read_gbs;    // memory read bandwidth
  std::function<void(const std::string& what, double value, const std::string& unit)> report;
};

// Measures with `probes` at each thread count up to `max_threads` (1, 2, 4, ... and
// max_threads itself).
plan::hardware_profile calibrate(const model& m, int max_threads, const calibration_probes& probes);

}  // namespace troupe::tools
