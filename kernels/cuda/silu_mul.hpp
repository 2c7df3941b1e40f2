// silu_mul on the device: gate = silu(gate) * up, n elements. CPU reference:
// kernels/cpu/silu_mul.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace troupe::cuda {

void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream);

}  // namespace troupe::cuda
