// Conversions between float and the 16-bit storage types on the device, rounding to
// nearest even. CPU reference: kernels/common/dtype.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/dtype.hpp"

namespace troupe::cuda {

void f32_to_bf16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream);
void bf16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream);
void f32_to_f16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream);
void f16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream);
// in as `type` (f32: a copy; bf16 or f16: the conversions above) into out.
void f32_to(dtype type, const float* in, void* out, int64_t n, cudaStream_t stream);

}  // namespace troupe::cuda
