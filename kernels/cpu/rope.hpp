// Rotary position embedding, applied in place to the heads of one token.
//
//   v:        [num_heads][head_dim]
//   cos, sin: [rot_dim / 2] for this token's position (the caller's table row)
//
// Pair i of each head is rotated by the angle whose cosine and sine are cos[i], sin[i].
// Which elements form pair i depends on the checkpoint's layout:
//   rope_layout::pairs: (2i, 2i+1), as llama2.c and GGUF llama store Q and K;
//   rope_layout::halves: (i, i + rot_dim/2), as Hugging Face checkpoints store them.
// Elements at or past rot_dim are left as they are.
#pragma once

#include <cstdint>

namespace troupe {

enum class rope_layout : uint8_t { pairs, halves };

void rope(float* v, int32_t num_heads, int32_t head_dim, int32_t rot_dim, const float* cos,
          const float* sin, rope_layout layout);

// Fills cos/sin tables [num_positions][rot_dim / 2] for angle = pos * base^(-2i/rot_dim),
// computed in float as the reference implementations do.
void rope_table(float* cos, float* sin, int32_t num_positions, int32_t rot_dim, float base);

// The same for given frequencies (angle = pos * freqs[i], freqs: [rot_dim / 2]), each
// cosine and sine times `scale` (1 but for YaRN's attention factor).
void rope_table(float* cos, float* sin, int32_t num_positions, int32_t rot_dim, const float* freqs,
                float scale = 1.0f);

}  // namespace troupe
