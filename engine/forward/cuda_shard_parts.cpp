#include "engine/forward/cuda_shard_parts.hpp"

#include <vector>

#include "kernels/common/dtype.hpp"
#include "kernels/cpu/embedding.hpp"

namespace troupe {

device_matrix::device_matrix(std::initializer_list<const matrix_view*> parts, dtype to) : type(to) {
  cols = (*parts.begin())->cols;
  for (const matrix_view* w : parts) {
    TROUPE_ASSERT(w->cols == cols, w->cols, cols);
    rows += w->rows;
  }
  // Every row of each part, through the embedding lookup that reads any stored type.
  std::vector<float> host(size_t(rows) * cols);
  size_t at = 0;
  for (const matrix_view* w : parts) {
    std::vector<int32_t> all(w->rows);
    for (int32_t r = 0; r < w->rows; ++r) all[r] = r;
    embedding(*w, all.data(), w->rows, host.data() + at, cols);
    at += size_t(w->rows) * cols;
  }
  if (to == dtype::f32) {
    f32 = cuda::buffer<float>(host.size());
    f32.upload(host);
    return;
  }
  std::vector<uint16_t> h(host.size());
  for (size_t i = 0; i < host.size(); ++i) h[i] = to == dtype::bf16 ? f32_to_bf16(host[i]) : f32_to_f16(host[i]);
  half = cuda::buffer<uint16_t>(h.size());
  half.upload(h);
}

cuda::buffer<float> upload_floats(const float* p, size_t n) {
  cuda::buffer<float> b(n);
  b.upload(p, n);
  return b;
}

void host_staged_collective::all_reduce_sum(float* data, int64_t n, CUstream_st* stream) {
  TROUPE_ASSERT(n >= 0, n);
  if (static_cast<size_t>(n) > staging_.size()) staging_ = cuda::pinned<float>(static_cast<size_t>(n));  // (KV eviction's sums)
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  cuda::check(cudaMemcpyAsync(staging_.get(), data, bytes, cudaMemcpyDeviceToHost, stream), "copy to the host");
  cuda::check(cudaStreamSynchronize(stream), "tensor-parallel partials");
  comm_.all_reduce_sum(staging_.get(), n);  // collective_aborted when a peer died
  cuda::check(cudaMemcpyAsync(data, staging_.get(), bytes, cudaMemcpyHostToDevice, stream), "copy to the device");
}

}  // namespace troupe
