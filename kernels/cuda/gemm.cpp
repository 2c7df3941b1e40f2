#include "kernels/cuda/gemm.hpp"

#include <cublas_v2.h>

#include <string>

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/gemv.hpp"

namespace troupe::cuda {

namespace {

void check_blas(cublasStatus_t s, const char* what, std::source_location where = std::source_location::current()) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw cuda_error(std::string(what) + ": " + cublasGetStatusName(s) + ": " + cublasGetStatusString(s) + " (" +
                     where_of(where) + ")");
}

}  // namespace

struct gemm_engine::impl {
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  buffer<uint8_t> workspace{size_t{32} << 20};  // cuBLAS's scratch: no allocation inside a graph capture
};

gemm_engine::gemm_engine(cudaStream_t stream) : impl_(std::make_unique<impl>()) {
  impl_->stream = stream;
  check_blas(cublasCreate(&impl_->handle), "cublasCreate");
  check_blas(cublasSetStream(impl_->handle, stream), "cublasSetStream");
  check_blas(cublasSetWorkspace(impl_->handle, impl_->workspace.get(), impl_->workspace.size()), "cublasSetWorkspace");
}

gemm_engine::~gemm_engine() {
  if (impl_->handle) cublasDestroy(impl_->handle);
}

// Row-major y = x w^T is column-major y^T = w x^T: cuBLAS sees w (k x n, column-major)
// transposed, times x (k x m) as it is, into y^T (n x m).
void gemm_engine::run(dtype type, const void* x, const void* w, float* y, int32_t m, int32_t n, int32_t k,
                      bool accumulate) {
  if (m == 0 || n == 0) return;
  if (type != dtype::f32 && type != dtype::bf16 && type != dtype::f16)
    throw cuda_error("gemm: the weights must be f32, bf16 or f16");
  if (type != dtype::f32 && m <= gemv_rows_ && gemv_fits(m, k)) {
    gemv(type, gemv_source{gemv_input::half, x}, static_cast<const uint16_t*>(w), y, m, n, k, accumulate, impl_->stream);
    return;
  }
  const cudaDataType_t t = type == dtype::f32 ? CUDA_R_32F : type == dtype::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const cublasComputeType_t compute = type == dtype::f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_blas(cublasGemmEx(impl_->handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, t, k, x, t, k, &beta, y, CUDA_R_32F,
                          n, compute, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
}

}  // namespace troupe::cuda
