// silu_mul on the device, over rows of [gate | up] ([rows][2 * n], what one GEMM over w1
// and w3 stacked gives): out[r][i] = silu(gate[r][i]) * up[r][i], written as out_type
// (f32, bf16 or f16; the next GEMM's input) into out ([rows][n]). CPU reference:
// kernels/cpu/silu_mul.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/dtype.hpp"

namespace troupe::cuda {

void silu_mul_rows(const float* gate_up, int32_t rows, int32_t n, dtype out_type, void* out, cudaStream_t stream);

}  // namespace troupe::cuda
