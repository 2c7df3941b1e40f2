// rmsnorm on the device, for rows rows of n: out = weight * x / sqrt(mean(x^2) + eps).
// out may alias x. CPU reference: kernels/cpu/rmsnorm.hpp (one row).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace troupe::cuda {

void rmsnorm(float* out, const float* x, int64_t stride, const float* weight, int32_t rows, int32_t n, float eps,
             cudaStream_t stream);

}  // namespace troupe::cuda
