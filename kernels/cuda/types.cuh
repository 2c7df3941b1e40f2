// Element types of the kernels in this directory (device code only): reading f32, bf16 and
// f16 as float, writing float as each (rounded to nearest even), and launching a kernel
// template for the type a dtype names.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common/dtype.hpp"
#include "kernels/cuda/device.hpp"

namespace troupe::cuda::detail {

template <typename T>
__device__ inline float to_float(T x);
template <>
__device__ inline float to_float(float x) { return x; }
template <>
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ inline float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ inline __half from_float(float x) { return __float2half_rn(x); }

// f(T{}) with T the device type of `type` (f32, bf16 or f16); anything else throws,
// naming `what`.
template <typename F>
void with_type(dtype type, const char* what, F&& f) {
  switch (type) {
    case dtype::f32: f(float{}); break;
    case dtype::bf16: f(__nv_bfloat16{}); break;
    case dtype::f16: f(__half{}); break;
    default: throw cuda_error(std::string(what) + ": the type must be f32, bf16 or f16 on the device");
  }
}

}  // namespace troupe::cuda::detail
