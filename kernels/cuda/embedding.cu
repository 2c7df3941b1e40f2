#include "kernels/cuda/embedding.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/types.cuh"

namespace troupe::cuda {

namespace {

template <typename T>
__global__ void embedding_kernel(const T* table, int64_t row_stride, int32_t dim, const int32_t* tokens, float* out,
                                 int64_t out_stride) {
  const int32_t t = blockIdx.x;
  const T* row = table + int64_t{tokens[t]} * row_stride;
  float* o = out + int64_t{t} * out_stride;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = detail::to_float(row[i]);
}

}  // namespace

void embedding(dtype type, const void* table, int64_t row_stride, int32_t dim, const int32_t* tokens,
               int32_t num_tokens, float* out, int64_t out_stride, cudaStream_t stream) {
  if (num_tokens == 0) return;
  const dim3 grid(num_tokens), block(256);
  switch (type) {
    case dtype::f32:
      embedding_kernel<<<grid, block, 0, stream>>>(static_cast<const float*>(table), row_stride, dim, tokens, out, out_stride);
      break;
    case dtype::bf16:
      embedding_kernel<<<grid, block, 0, stream>>>(static_cast<const __nv_bfloat16*>(table), row_stride, dim, tokens, out,
                                                   out_stride);
      break;
    case dtype::f16:
      embedding_kernel<<<grid, block, 0, stream>>>(static_cast<const __half*>(table), row_stride, dim, tokens, out, out_stride);
      break;
    default:
      throw cuda_error("embedding: the table must be f32, f16 or bf16 on the device");
  }
  check_launch("embedding");
}

}  // namespace troupe::cuda
