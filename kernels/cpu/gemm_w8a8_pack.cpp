// pack_q8: q8_0 weights into the block layout both VNNI and AMX read (gemm_w8a8.hpp).
#include <cstring>

#include "kernels/cpu/gemm_w8a8_parts.hpp"

namespace troupe {

using w8a8::block;

bool w8a8_layout(const matrix_view& w) {
  return w.type == dtype::q8_0 && (w.group_size == 32 || w.group_size == 64) && w.cols % w.group_size == 0;
}

void q8_packed::lay_out(int32_t r, int32_t c, int32_t grp, bool cmp) {
  rows = r;
  cols = c;
  group = grp;
  groups = c / grp;
  blocks = (r + block - 1) / block;
  compact = cmp;
  block_bytes = groups * values_bytes() + (int64_t{groups} * 16 * scale_bytes() + 63) / 64 * 64;
  data.assign(static_cast<size_t>(int64_t{blocks} * block_bytes), 0);
}

q8_packed pack_q8(const matrix_view& w) {
  TROUPE_ASSERT(w8a8_layout(w), w.group_size, w.cols);
  // Compact when every scale survives F16 bit for bit.
  bool compact = true;
  for (int32_t r = 0; r < w.rows && compact; ++r)
    for (int32_t g = 0; g < w.cols / w.group_size && compact; ++g) {
      const float scale = w.scale_at(r, g), back = f16_to_f32(f32_to_f16(scale));
      compact = std::memcmp(&scale, &back, sizeof scale) == 0;
    }
  q8_packed p;
  p.lay_out(w.rows, w.cols, w.group_size, compact);
  for (int32_t r = 0; r < w.rows; ++r)
    for (int32_t g = 0; g < p.groups; ++g) {
      const int8_t* src = w.q + r * w.q_row_stride + g * w.q_group_stride;
      int8_t* dst = p.data.data() + p.tile_offset(r / block, g);
      for (int32_t j = 0; j < p.group / 4; ++j) std::memcpy(dst + j * 64 + (r % block) * 4, src + j * 4, 4);
      int8_t* scales = p.data.data() + p.scales_offset(r / block, g);
      const float scale = w.scale_at(r, g);
      if (p.compact) {
        const uint16_t h = f32_to_f16(scale);
        std::memcpy(scales + (r % block) * 2, &h, 2);
      } else {
        std::memcpy(scales + (r % block) * 4, &scale, 4);
      }
    }
  return p;
}

}  // namespace troupe
