// Element types of weight tensors as checkpoints store them, and scalar conversions.
// Activations are always float; these types describe weights (and, later, KV blocks).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace troupe {

enum class dtype : uint8_t {
  f32,
  f16,   // IEEE binary16
  bf16,  // bfloat16: the upper half of a binary32
  q8_0,  // symmetric int8 in groups, one scale per group (see matrix_view)
};

constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::q8_0: return "q8_0";
  }
  return "?";
}

// The type dtype_name gives `name`, if any.
constexpr std::optional<dtype> dtype_named(std::string_view name) {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0})
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t{h} << 16); }

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#endif
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: value = man * 2^-24
    float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

// Round to nearest even, overflow to infinity.
inline uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // inf / overflow
  if (abs < 0x38800000u) {
    // subnormal or zero in f16: scale to units of 2^-24 and round to nearest even
    const float v = bits_to_f32(abs) * 16777216.0f;
    const float r = __builtin_nearbyintf(v);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t m = abs + 0xfffu + ((abs >> 13) & 1u);  // round mantissa to 10 bits
  return static_cast<uint16_t>(sign | ((m - 0x38000000u) >> 13));
}

}  // namespace troupe
