// Helpers of the GPU suite's kernel tests: seeded random inputs, device buffers filled
// from the host or poisoned with NaN bytes, 16-bit roundings and error bounds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/common/dtype.hpp"
#include "kernels/cuda/device.hpp"

namespace troupe::gpu_test {

inline std::vector<float> randoms(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

template <typename T>
inline cuda::buffer<T> on_device(const std::vector<T>& host) {
  cuda::buffer<T> b(host.size());
  b.upload(host);
  return b;
}

template <typename T>
inline cuda::buffer<T> poisoned(size_t n) {
  cuda::buffer<T> b(n);
  b.fill_bytes(0xFF);
  return b;
}

inline void sync() { cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

// x rounded to a 16-bit type and back (to_16 and from_16 as the device stores it).
inline uint16_t to_16(dtype t, float x) { return t == dtype::bf16 ? f32_to_bf16(x) : f32_to_f16(x); }
inline float from_16(dtype t, uint16_t x) { return t == dtype::bf16 ? bf16_to_f32(x) : f16_to_f32(x); }
// A 16-bit type's relative rounding step.
inline float half_ulp(dtype t) { return t == dtype::bf16 ? 1.0f / 128 : 1.0f / 1024; }

// |a - b| <= rel * max(1, |b|)
inline void close(float a, float b, float rel) { CHECK(std::fabs(a - b) <= rel * std::max(1.0f, std::fabs(b))); }

// The exact sum of x[i] . w[j] over k with both as the device holds them (16-bit).
inline std::vector<double> reference_16(dtype t, const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int32_t m,
                                 int32_t n, int32_t k) {
  std::vector<double> y(size_t(m) * n);
  for (int32_t i = 0; i < m; ++i)
    for (int32_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int32_t c = 0; c < k; ++c) acc += double(from_16(t, x[size_t(i) * k + c])) * from_16(t, w[size_t(j) * k + c]);
      y[size_t(i) * n + j] = acc;
    }
  return y;
}

}  // namespace troupe::gpu_test
