#include "kernels/cpu/rope.hpp"

#include <cmath>
#include <vector>

namespace troupe {

void rope(float* v, int32_t num_heads, int32_t head_dim, int32_t rot_dim, const float* cos,
          const float* sin, rope_layout layout) {
  const int32_t half = rot_dim / 2;
  for (int32_t h = 0; h < num_heads; ++h) {
    float* head = v + h * head_dim;
    for (int32_t i = 0; i < half; ++i) {
      const int32_t a = layout == rope_layout::pairs ? 2 * i : i;
      const int32_t b = layout == rope_layout::pairs ? 2 * i + 1 : i + half;
      const float v0 = head[a];
      const float v1 = head[b];
      head[a] = v0 * cos[i] - v1 * sin[i];
      head[b] = v0 * sin[i] + v1 * cos[i];
    }
  }
}

void rope_table(float* cos, float* sin, int32_t num_positions, int32_t rot_dim, float base) {
  const int32_t half = rot_dim / 2;
  std::vector<float> freqs(half);
  for (int32_t i = 0; i < half; ++i)
    freqs[i] = 1.0f / powf(base, static_cast<float>(2 * i) / static_cast<float>(rot_dim));
  rope_table(cos, sin, num_positions, rot_dim, freqs.data());
}

void rope_table(float* cos, float* sin, int32_t num_positions, int32_t rot_dim, const float* freqs, float scale) {
  const int64_t half = rot_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    for (int64_t p = 0; p < num_positions; ++p) {
      const float angle = static_cast<float>(p) * freqs[i];
      cos[p * half + i] = cosf(angle) * scale;
      sin[p * half + i] = sinf(angle) * scale;
    }
  }
}

}  // namespace troupe
