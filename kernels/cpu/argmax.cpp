#include "kernels/cpu/argmax.hpp"

#include <cmath>
#include <limits>

#include "kernels/cpu/simd.hpp"

namespace troupe {

namespace {

// The definition: a later value replaces the best only when it is greater, so the first
// of equal maxima wins and a NaN never does (unless it is x[0], which nothing beats).
int32_t argmax_scalar(const float* x, int32_t from, int32_t n, int32_t best) {
  for (int32_t i = from; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

int32_t argmax(const float* x, int32_t n) {
  if (n < 2 * simd::width || std::isnan(x[0])) return argmax_scalar(x, 1, n, 0);
  // Sixteen lanes, each keeping its greatest value and the first index that held it; then
  // the greatest of those, the smallest index among equals, and the tail in order.
  using v16i = simd::v16i;
  simd::v16f best = simd::splat(-std::numeric_limits<float>::infinity());
  v16i where = v16i{} - 1;
  v16i index = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const v16i step = v16i{} + simd::width;
  int32_t i = 0;
  for (; i + simd::width <= n; i += simd::width, index += step) {
    const simd::v16f v = simd::load(x + i);
    const v16i greater = v > best;
    best = greater ? v : best;
    where = greater ? index : where;
  }
  int32_t b = 0;
  for (int lane = 0; lane < simd::width; ++lane) {
    const int32_t w = where[lane];
    if (w >= 0 && (best[lane] > x[b] || (best[lane] == x[b] && w < b))) b = w;
  }
  return argmax_scalar(x, i, n, b);
}

}  // namespace troupe
