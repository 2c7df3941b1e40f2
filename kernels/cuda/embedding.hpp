// embedding on the device: out[t] = table[tokens[t]] as float. table: [vocab][row_stride]
// of f32, f16 or bf16 (Q8_0 weights are dequantized at load); out: [num_tokens][out_stride].
// CPU reference: kernels/cpu/embedding.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/dtype.hpp"

namespace troupe::cuda {

void embedding(dtype type, const void* table, int64_t row_stride, int32_t dim, const int32_t* tokens,
               int32_t num_tokens, float* out, int64_t out_stride, cudaStream_t stream);

}  // namespace troupe::cuda
