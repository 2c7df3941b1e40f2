#include "kernels/common/dtype.hpp"

#include <cmath>
#include <limits>

#include <doctest/doctest.h>

namespace troupe {

TEST_CASE("f16 round trip is exact for every f16 value, and rounds to nearest even") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      CHECK(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    CHECK(f32_to_f16(f) == h);
  }
  CHECK(f16_to_f32(f32_to_f16(1.0f + 1.0f / 2048)) == 1.0f);  // tie rounds to even
  CHECK(f16_to_f32(f32_to_f16(65520.0f)) == std::numeric_limits<float>::infinity());
  CHECK(f16_to_f32(0x0001) == doctest::Approx(5.9604645e-8));
}

TEST_CASE("bf16 keeps the upper half and rounds to nearest even") {
  CHECK(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
  CHECK(bf16_to_f32(f32_to_bf16(-2.5f)) == -2.5f);
  CHECK(f32_to_bf16(bits_to_f32(0x3f808000u)) == 0x3f80);  // tie to even (down)
  CHECK(f32_to_bf16(bits_to_f32(0x3f818000u)) == 0x3f82);  // tie to even (up)
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace troupe
