#include "kernels/cpu/rmsnorm.hpp"

#include <cmath>

#include "kernels/cpu/simd.hpp"

namespace troupe {

void rmsnorm(float* out, const float* x, const float* weight, int32_t n, float eps) {
  simd::v16f acc = simd::zero();
  int32_t i = 0;
  for (; i + simd::width <= n; i += simd::width) {
    const simd::v16f v = simd::load(x + i);
    acc = simd::fma(v, v, acc);
  }
  float ss = simd::reduce_add(acc);
  for (; i < n; ++i) ss += x[i] * x[i];
  ss /= static_cast<float>(n);
  ss += eps;
  const float inv = 1.0f / std::sqrt(ss);
  for (int32_t j = 0; j < n; ++j) out[j] = weight[j] * (inv * x[j]);
}

}  // namespace troupe
