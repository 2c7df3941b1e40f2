// pack_q8: q8_0 weights into the record layout both VNNI and AMX read (gemm_w8a8.hpp).
#include <cstring>

#include "kernels/cpu/gemm_w8a8_parts.hpp"

namespace troupe {

using w8a8::block;

bool w8a8_layout(const matrix_view& w) {
  return w.type == dtype::q8_0 && (w.group_size == 32 || w.group_size == 64) && w.cols % w.group_size == 0;
}

q8_packed pack_q8(const matrix_view& w) {
  TROUPE_ASSERT(w8a8_layout(w), w.group_size, w.cols);
  q8_packed p;
  p.rows = w.rows;
  p.cols = w.cols;
  p.group = w.group_size;
  p.groups = w.cols / w.group_size;
  p.blocks = (w.rows + block - 1) / block;
  // Compact when every scale survives F16 bit for bit (|sum| <= 64 * 128 fits int16).
  p.compact = true;
  for (int32_t r = 0; r < w.rows && p.compact; ++r)
    for (int32_t g = 0; g < p.groups && p.compact; ++g) {
      const float scale = w.scale_at(r, g), back = f16_to_f32(f32_to_f16(scale));
      p.compact = std::memcmp(&scale, &back, sizeof scale) == 0;
    }
  const int32_t sum_bytes = p.compact ? 2 : 4;
  p.data.assign(static_cast<size_t>(int64_t{p.blocks} * p.groups * p.record_bytes()), 0);
  for (int32_t r = 0; r < w.rows; ++r)
    for (int32_t g = 0; g < p.groups; ++g) {
      const int8_t* src = w.q + r * w.q_row_stride + g * w.q_group_stride;
      int8_t* dst = p.data.data() + (int64_t{r / block} * p.groups + g) * p.record_bytes();
      for (int32_t j = 0; j < p.group / 4; ++j) std::memcpy(dst + j * 64 + (r % block) * 4, src + j * 4, 4);
      int32_t s = 0;
      for (int32_t k = 0; k < p.group; ++k) s += src[k];
      int8_t* sums = dst + p.group * block;
      int8_t* scales = sums + block * sum_bytes;
      const float scale = w.scale_at(r, g);
      if (p.compact) {
        const auto s16 = static_cast<int16_t>(s);
        const uint16_t h = f32_to_f16(scale);
        std::memcpy(sums + (r % block) * 2, &s16, 2);
        std::memcpy(scales + (r % block) * 2, &h, 2);
      } else {
        std::memcpy(sums + (r % block) * 4, &s, 4);
        std::memcpy(scales + (r % block) * 4, &scale, 4);
      }
    }
  return p;
}

}  // namespace troupe
