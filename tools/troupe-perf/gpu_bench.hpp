// gpu_bench: troupe-perf's GPU measurements (built with CUDA): the device's copy bandwidth
// (device to device, the ceiling for streaming weights) and decode tokens/s of a GPU shard
// per batch size, with the weight bandwidth each achieves.
#pragma once

#include <string>
#include <vector>

#include "engine/model/model.hpp"
#include "engine/util/expected.hpp"
#include "kernels/cpu/sample.hpp"

namespace troupe::tools {

struct gpu_decode_result {
  int batch = 0;
  double tokens_per_s = 0;
  double weight_gbs = 0;  // weight bytes read per step / step time
};

struct gpu_report {
  std::string device;
  double copy_gbs = 0;    // device-to-device copy: bytes read + written per second
  std::vector<gpu_decode_result> decode;
};

struct gpu_bench_options {
  int device = 0;
  std::string weights = "bf16";  // "bf16", "f16" or "f32"
  bool graphs = true;            // decode steps as CUDA graphs
  int gemv_rows = 1;             // troupe's GEMV for batches up to this (0: cuBLAS only)
  bool logits_to_host = false;   // each step's logits to the host, the choice made there (else on the device)
  truncation how{0.0f, 0, 1.0f, 0.0f};  // temperature 0: greedy
};

// An error when the build has no CUDA or the device is not there.
expected<gpu_report> measure_gpu(const model& m, const gpu_bench_options& o, const std::vector<int>& batches, int tokens,
                                 int runs);

}  // namespace troupe::tools
