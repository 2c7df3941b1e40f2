// GEMV on the device for decode steps of a few sequences: y[m][n] = x[m][k] . w[n][k]^T
// (row-major, as kernels/cpu/gemm.hpp), or y += that when accumulate is set (the residual
// add of a row-parallel projection), for m <= gemv_max_rows, w in bf16 or f16 and FP32
// accumulation. Blocks of 256 threads, as many as stay resident, take 8 output columns at
// a time, their threads splitting k, so that the weights stream once in 16-byte loads with
// enough of them in flight to run at memory bandwidth even for narrow matrices; cuBLAS's
// GEMM kernels are built for larger m.
//
// Each block first stages x in shared memory, in w's type, from one of:
//   half     x already in w's type, [m][k];
//   f32      floats [m][k], rounded to w's type (attention's output);
//   rmsnorm  floats [m][k], each row normed with the weights `norm` (rmsnorm_to's values);
//   silu_mul floats [m][2k], rows of [gate | up]: silu(gate) * up (silu_mul_rows's values);
// so the kernel that would have written the GEMM's input is not launched at all.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/dtype.hpp"

namespace troupe::cuda {

inline constexpr int32_t gemv_max_rows = 8;

enum class gemv_input : int32_t { half, f32, rmsnorm, silu_mul };

struct gemv_source {
  gemv_input kind = gemv_input::half;
  const void* x = nullptr;
  const float* norm = nullptr;  // rmsnorm: the norm's weights, [k]
  float eps = 0.0f;             // rmsnorm
};

// Whether gemv takes this shape: 1 <= m <= gemv_max_rows, k a multiple of 8 and m rows of
// k staged values within the shared memory a block may use (the pointers must also be
// 16-byte aligned, as cudaMalloc's are).
bool gemv_fits(int32_t m, int32_t k);

void gemv(dtype type, const gemv_source& x, const uint16_t* w, float* y, int32_t m, int32_t n, int32_t k,
          bool accumulate, cudaStream_t stream);

}  // namespace troupe::cuda
