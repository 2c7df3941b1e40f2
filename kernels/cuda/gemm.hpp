// GEMMs on the device through cuBLAS, with the CPU GEMM's meaning
// (kernels/cpu/gemm.hpp): y[m][n] = x[m][k] . w[n][k]^T, row-major, w a weight matrix
// stored row by row.
//
//   f32:   FP32 in, FP32 out, FP32 arithmetic without tensor-core shortcuts (for the
//          exactness tests and the FP32 path).
//   half:  weights in BF16 or FP16 on the device; x is converted to the same type into a
//          scratch buffer, multiplied on the tensor cores with FP32 accumulation, and y is
//          FP32.
//   run:   x already in the weights' type (the kernel before wrote it so), y FP32, and
//          y += x . w^T when accumulate is set (a residual add folded into the GEMM). Decode
//          steps of up to set_gemv_rows(n) rows (default 1, at most gemv_max_rows) on
//          16-bit weights go to troupe's GEMV (kernels/cuda/gemv.hpp); 0: cuBLAS only.
//
// The engine owns its cuBLAS workspace, so its GEMMs can be captured into CUDA graphs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "kernels/common/dtype.hpp"

namespace troupe::cuda {

class gemm_engine {
 public:
  explicit gemm_engine(cudaStream_t stream);
  ~gemm_engine();
  gemm_engine(const gemm_engine&) = delete;
  gemm_engine& operator=(const gemm_engine&) = delete;

  void f32(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k);
  // wtype: dtype::bf16 or dtype::f16; x_scratch holds at least m * k 16-bit values.
  void half(dtype wtype, const float* x, uint16_t* x_scratch, const uint16_t* w, float* y, int32_t m, int32_t n,
            int32_t k);
  void run(dtype type, const void* x, const void* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate);
  void set_gemv_rows(int32_t rows) { gemv_rows_ = rows; }

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  int32_t gemv_rows_ = 1;
};

}  // namespace troupe::cuda
