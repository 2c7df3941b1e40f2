#include "kernels/cpu/silu_mul.hpp"

#include <cstring>

#include "kernels/cpu/simd.hpp"

namespace troupe {

namespace {

simd::v16f silu_mul16(simd::v16f g, simd::v16f u) {
  const simd::v16f one = simd::splat(1.0f);
  return g * (one / (one + simd::exp(-g))) * u;
}

}  // namespace

void silu_mul(float* gate, const float* up, int32_t n) {
  int32_t i = 0;
  for (; i + simd::width <= n; i += simd::width)
    simd::store(gate + i, silu_mul16(simd::load(gate + i), simd::load(up + i)));
  if (i < n) {
    alignas(64) float g[simd::width] = {}, u[simd::width] = {};
    std::memcpy(g, gate + i, sizeof(float) * (n - i));
    std::memcpy(u, up + i, sizeof(float) * (n - i));
    simd::store(g, silu_mul16(simd::load(g), simd::load(u)));
    std::memcpy(gate + i, g, sizeof(float) * (n - i));
  }
}

}  // namespace troupe
