// gpu_bench: troupe-perf's GPU measurements (built with CUDA): the device's copy bandwidth
// (device to device, the ceiling for streaming weights) and decode tokens/s of a GPU shard
// per batch size, with the weight bandwidth each achieves.
#pragma once

#include <string>
#include <vector>

#include "engine/model/model.hpp"
#include "engine/util/expected.hpp"

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

// weights: "bf16", "f16" or "f32". An error when the build has no CUDA or the device is not there.
expected<gpu_report> measure_gpu(const model& m, int device, const std::string& weights, const std::vector<int>& batches,
                                 int tokens, int runs);

}  // namespace troupe::tools
