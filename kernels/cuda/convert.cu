#include "kernels/cuda/convert.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/device.hpp"

namespace troupe::cuda {

namespace {

__global__ void f32_to_bf16_kernel(const float* in, uint16_t* out, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
}
__global__ void bf16_to_f32_kernel(const uint16_t* in, float* out, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(__ushort_as_bfloat16(in[i]));
}
__global__ void f32_to_f16_kernel(const float* in, uint16_t* out, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __half_as_ushort(__float2half_rn(in[i]));
}
__global__ void f16_to_f32_kernel(const uint16_t* in, float* out, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __half2float(__ushort_as_half(in[i]));
}

unsigned blocks(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

void f32_to_bf16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<blocks(n), 256, 0, stream>>>(in, out, n);
  check_launch("f32_to_bf16");
}
void bf16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<blocks(n), 256, 0, stream>>>(in, out, n);
  check_launch("bf16_to_f32");
}
void f32_to_f16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_f16_kernel<<<blocks(n), 256, 0, stream>>>(in, out, n);
  check_launch("f32_to_f16");
}
void f16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  f16_to_f32_kernel<<<blocks(n), 256, 0, stream>>>(in, out, n);
  check_launch("f16_to_f32");
}

void f32_to(dtype type, const float* in, void* out, int64_t n, cudaStream_t stream) {
  switch (type) {
    case dtype::f32:
      check(cudaMemcpyAsync(out, in, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream), "f32_to (copy)");
      return;
    case dtype::bf16: f32_to_bf16(in, static_cast<uint16_t*>(out), n, stream); return;
    case dtype::f16: f32_to_f16(in, static_cast<uint16_t*>(out), n, stream); return;
    default: throw cuda_error("f32_to: the type must be f32, bf16 or f16");
  }
}

}  // namespace troupe::cuda
