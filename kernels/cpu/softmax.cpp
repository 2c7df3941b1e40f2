#include "kernels/cpu/softmax.hpp"

#include <cmath>
#include <cstring>

#include "kernels/cpu/simd.hpp"

namespace troupe {

void softmax(float* x, int32_t n) {
  int32_t i = 0;
  simd::v16f vmax = simd::splat(-INFINITY);
  for (; i + simd::width <= n; i += simd::width) {
    const simd::v16f v = simd::load(x + i);
    vmax = v > vmax ? v : vmax;
  }
  float max = simd::reduce_max(vmax);
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  const simd::v16f vm = simd::splat(max);
  simd::v16f vsum = simd::zero();
  for (i = 0; i + simd::width <= n; i += simd::width) {
    const simd::v16f e = simd::exp(simd::load(x + i) - vm);
    simd::store(x + i, e);
    vsum += e;
  }
  float sum = simd::reduce_add(vsum);
  if (i < n) {
    alignas(64) float tail[simd::width] = {};
    std::memcpy(tail, x + i, sizeof(float) * (n - i));
    simd::store(tail, simd::exp(simd::load(tail) - vm));
    for (int32_t j = 0; j < n - i; ++j) {
      x[i + j] = tail[j];
      sum += tail[j];
    }
  }
  // Times the reciprocal (the sum is at least 1, the maximum's own term): dividing each
  // element took about a quarter of the whole softmax's time.
  const float inv = 1.0f / sum;
  const simd::v16f vs = simd::splat(inv);
  for (i = 0; i + simd::width <= n; i += simd::width) simd::store(x + i, simd::load(x + i) * vs);
  for (; i < n; ++i) x[i] *= inv;
}

}  // namespace troupe
