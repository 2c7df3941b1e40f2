// argmax on the device: out[r] = the first index of the largest of x[r][0..n). CPU
// reference: kernels/cpu/argmax.hpp (one row).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace troupe::cuda {

void argmax(const float* x, int64_t stride, int32_t rows, int32_t n, int32_t* out, cudaStream_t stream);

}  // namespace troupe::cuda
