#include "kernels/cuda/silu_mul.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/rows.cuh"

namespace troupe::cuda {

namespace {

template <typename T>
__global__ void silu_mul_rows_kernel(const float* gate_up, int32_t n, T* out) {
  const int32_t r = blockIdx.y;
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* row = gate_up + int64_t{r} * 2 * n;
  out[int64_t{r} * n + i] = detail::from_float<T>(detail::silu_times(row[i], row[n + i]));
}

}  // namespace

void silu_mul_rows(const float* gate_up, int32_t rows, int32_t n, dtype out_type, void* out, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  const dim3 grid(static_cast<unsigned>((n + 255) / 256), static_cast<unsigned>(rows));
  detail::with_type(out_type, "silu_mul_rows", [&](auto t) {
    using T = decltype(t);
    silu_mul_rows_kernel<<<grid, 256, 0, stream>>>(gate_up, n, static_cast<T*>(out));
  });
  check_launch("silu_mul_rows");
}

}  // namespace troupe::cuda
