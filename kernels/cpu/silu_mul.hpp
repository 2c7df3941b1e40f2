// SwiGLU gate: gate[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x). n elements.
#pragma once

#include <cstdint>

namespace troupe {

void silu_mul(float* gate, const float* up, int32_t n);

}  // namespace troupe
