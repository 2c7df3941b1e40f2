// rmsnorm: out[i] = weight[i] * (x[i] / sqrt(mean(x^2) + eps)), for one vector of n.
// out may alias x.
#pragma once

#include <cstdint>

namespace troupe {

void rmsnorm(float* out, const float* x, const float* weight, int32_t n, float eps);

}  // namespace troupe
