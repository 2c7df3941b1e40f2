#include "kernels/cpu/silu_mul.hpp"

#include <cmath>

namespace troupe {

void silu_mul(float* gate, const float* up, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    float v = gate[i];
    v *= 1.0f / (1.0f + expf(-v));
    gate[i] = v * up[i];
  }
}

}  // namespace troupe
