#include "kernels/cpu/softmax.hpp"

#include <cmath>

namespace troupe {

void softmax(float* x, int32_t n) {
  float max = x[0];
  for (int32_t i = 1; i < n; ++i) max = x[i] > max ? x[i] : max;
  float sum = 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    x[i] = expf(x[i] - max);
    sum += x[i];
  }
  for (int32_t i = 0; i < n; ++i) x[i] /= sum;
}

}  // namespace troupe
