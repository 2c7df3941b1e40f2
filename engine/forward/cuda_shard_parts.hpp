// cuda_shard_parts: what the GPU shard (cuda_transformer_shard.cpp) keeps besides its
// step: weight matrices in device memory, and the all-reduce through host memory for
// tensor-parallel stages without NCCL. Built with the CUDA kernels only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "engine/forward/collective.hpp"
#include "engine/forward/nccl_group.hpp"
#include "kernels/common/matrix_view.hpp"
#include "kernels/cuda/device.hpp"

namespace troupe {

// A weight matrix [rows][cols] in device memory, f32 or 16-bit: one stored matrix, or
// several with the same columns stacked by rows (one GEMM computes all their outputs).
// Any stored type (Q8_0, F16, BF16, F32; slices included) is dequantized on the host, then
// converted to `to` and uploaded.
struct device_matrix {
  dtype type = dtype::f32;
  int32_t rows = 0, cols = 0;
  cuda::buffer<float> f32;
  cuda::buffer<uint16_t> half;

  device_matrix() = default;
  device_matrix(std::initializer_list<const matrix_view*> parts, dtype to);
  const void* data() const { return type == dtype::f32 ? static_cast<const void*>(f32.get()) : half.get(); }
};

// n floats from host memory, in a new device buffer.
cuda::buffer<float> upload_floats(const float* p, size_t n);

// The all-reduce through host memory: the partials copied out, summed by the CPU's
// collective in rank order, copied back. For stages without NCCL (and for checking the
// split on a single device): correct on any devices, but each reduction waits for the
// stream and crosses the bus twice.
class host_staged_collective final : public gpu_collective {
 public:
  host_staged_collective(collective& comm, size_t max_elements) : comm_(comm), staging_(max_elements) {}
  void all_reduce_sum(float* data, int64_t n, CUstream_st* stream) override;
  void check() override {}  // its all-reduce waits, and fails, in all_reduce_sum

 private:
  collective& comm_;
  cuda::pinned<float> staging_;
};

}  // namespace troupe
