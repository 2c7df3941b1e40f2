#include "kernels/cuda/gemm.hpp"

#include <cublas_v2.h>

#include <string>

#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/device.hpp"

namespace troupe::cuda {

namespace {

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw cuda_error(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

}  // namespace

struct gemm_engine::impl {
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
};

gemm_engine::gemm_engine(cudaStream_t stream) : impl_(std::make_unique<impl>()) {
  impl_->stream = stream;
  check_blas(cublasCreate(&impl_->handle), "cublasCreate");
  check_blas(cublasSetStream(impl_->handle, stream), "cublasSetStream");
}

gemm_engine::~gemm_engine() {
  if (impl_->handle) cublasDestroy(impl_->handle);
}

// Row-major y = x w^T is column-major y^T = w x^T: cuBLAS sees w (k x n, column-major)
// transposed, times x (k x m) as it is, into y^T (n x m).
void gemm_engine::f32(const float* x, const float* w, float* y, int32_t m, int32_t n, int32_t k) {
  if (m == 0 || n == 0) return;
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasGemmEx(impl_->handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_32F, k, x, CUDA_R_32F, k,
                          &zero, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx (f32)");
}

void gemm_engine::half(dtype wtype, const float* x, uint16_t* x_scratch, const uint16_t* w, float* y, int32_t m,
                       int32_t n, int32_t k) {
  if (m == 0 || n == 0) return;
  if (wtype != dtype::bf16 && wtype != dtype::f16) throw cuda_error("gemm: half() takes bf16 or f16 weights");
  const cudaDataType_t t = wtype == dtype::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  if (wtype == dtype::bf16)
    f32_to_bf16(x, x_scratch, int64_t{m} * k, impl_->stream);
  else
    f32_to_f16(x, x_scratch, int64_t{m} * k, impl_->stream);
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasGemmEx(impl_->handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, t, k, x_scratch, t, k, &zero, y,
                          CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx (16-bit)");
}

}  // namespace troupe::cuda
