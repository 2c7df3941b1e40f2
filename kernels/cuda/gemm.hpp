// GEMMs on the device through cuBLAS, with the CPU GEMM's meaning
// (kernels/cpu/gemm.hpp): y[m][n] = x[m][k] . w[n][k]^T, row-major, w a weight matrix
// stored row by row.
//
//   f32:   FP32 in, FP32 out, FP32 arithmetic without tensor-core shortcuts (for the
//          exactness tests and the FP32 path).
//   half:  weights in BF16 or FP16 on the device; x is converted to the same type into a
//          scratch buffer, multiplied on the tensor cores with FP32 accumulation, and y is
//          FP32.
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

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::cuda
