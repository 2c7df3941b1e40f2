// rmsnorm on the device, for rows rows of n: out = weight * x / sqrt(mean(x^2) + eps),
// written as out_type (f32, bf16 or f16, rounded to nearest even) into out
// ([rows][out_stride]): a GEMM on 16-bit weights takes its input straight from the norm.
// An f32 out may alias x. CPU reference: kernels/cpu/rmsnorm.hpp (one row).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/dtype.hpp"

namespace troupe::cuda {

void rmsnorm_to(dtype out_type, void* out, int64_t out_stride, const float* x, int64_t stride, const float* weight,
                int32_t rows, int32_t n, float eps, cudaStream_t stream);

}  // namespace troupe::cuda
