// GEMMs on the device through cuBLAS, with the CPU GEMM's meaning
// (kernels/cpu/gemm.hpp): y[m][n] = x[m][k] . w[n][k]^T, row-major, w a weight matrix
// stored row by row.
//
// run() takes x already in the weights' type (the kernel before wrote it so) and writes y
// in FP32, or adds to it when accumulate is set (a residual add folded into the GEMM):
//   f32 weights:        FP32 arithmetic without tensor-core shortcuts (the exact path);
//   bf16 / f16 weights: tensor cores with FP32 accumulation; steps of up to
//                       set_gemv_rows(n) rows (default 1, at most gemv_max_rows) go to
//                       troupe's GEMV (kernels/cuda/gemv.hpp) instead; 0: cuBLAS only.
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

  void run(dtype type, const void* x, const void* w, float* y, int32_t m, int32_t n, int32_t k, bool accumulate);
  void set_gemv_rows(int32_t rows) { gemv_rows_ = rows; }

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  int32_t gemv_rows_ = 1;
};

}  // namespace troupe::cuda
