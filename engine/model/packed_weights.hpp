// packed_weights: q8_0 matrices repacked for the int8 kernels (kernels/cpu/gemm_w8a8.hpp),
// made on first use and kept for the model's lifetime, so every shard of the model in a
// process (tensor-parallel slices, engines made one after another) packs a matrix once.
// A slice is its own entry, keyed by where its values start and its shape.
//
// Thread-safe: shards constructed at once pack different matrices in parallel, and one
// matrix once.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "kernels/cpu/gemm_w8a8.hpp"

namespace troupe {

class packed_weights {
 public:
  const q8_packed& get(const matrix_view& w);

 private:
  struct entry {
    std::once_flag once;
    q8_packed packed;
  };
  using key = std::tuple<const void*, const void*, int32_t, int32_t>;
  std::mutex mu_;
  std::map<key, std::shared_ptr<entry>> entries_;
};

}  // namespace troupe
