// Sixteen-lane float vectors (GCC vector extensions) and loaders that dequantize weights
// into them. One lane width on every ISA: with AVX-512 a v16f is one register, with AVX2
// two, with the portable baseline four; the arithmetic, and therefore every result, is
// the same function of the inputs whatever the width (up to FMA contraction).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/common/dtype.hpp"

namespace troupe::simd {

constexpr int width = 16;

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

inline v16f zero() { return v16f{}; }
inline v16f splat(float f) { return v16f{f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f}; }

inline v16f load(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, v16f v) { std::memcpy(p, &v, sizeof v); }

// Eight-lane halves, for ISAs with sixteen vector registers (AVX2), where a v16f is two
// registers and GCC moves sixteen-lane values through memory between operations: a kernel
// keeps lanes 0-7 and 8-15 of each v16f as two v8f. Each lane's arithmetic is the same,
// so the results are the v16f kernel's bits.
inline v8f splat8(float f) { return v8f{f, f, f, f, f, f, f, f}; }

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline v8f fma8(v8f a, v8f b, v8f c) {
#if defined(__FMA__)
  return reinterpret_cast<v8f>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b),
                                               reinterpret_cast<__m256>(c)));
#else
  return a * b + c;
#endif
}

inline v8f load8_i8(const int8_t* p) {
#if defined(__AVX2__)
  return reinterpret_cast<v8f>(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
#else
  v8f f;
  for (int i = 0; i < 8; ++i) f[i] = static_cast<float>(p[i]);
  return f;
#endif
}

inline v8f load8_f16(const uint16_t* p) {
#if defined(__F16C__)
  return reinterpret_cast<v8f>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  v8f f;
  for (int i = 0; i < 8; ++i) f[i] = f16_to_f32(p[i]);
  return f;
#endif
}

inline v8f load8_bf16(const uint16_t* p) {
#if defined(__AVX2__)
  return reinterpret_cast<v8f>(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
#else
  v8f f;
  for (int i = 0; i < 8; ++i) f[i] = bf16_to_f32(p[i]);
  return f;
#endif
}

// Two eight-lane halves as one v16f.
inline v16f join(v8f lo, v8f hi) {
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

inline v16f load_bf16(const uint16_t* p) {
#if defined(__AVX512F__)
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  // Zero-masked forms: the plain ones make GCC 12 warn about their undefined source.
  return reinterpret_cast<v16f>(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
#else
  return join(load8_bf16(p), load8_bf16(p + 8));
#endif
}

inline v16f load_f16(const uint16_t* p) {
#if defined(__AVX512F__)
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return reinterpret_cast<v16f>(_mm512_maskz_cvtph_ps(0xffff, h));
#else
  return join(load8_f16(p), load8_f16(p + 8));
#endif
}

// Sixteen lanes rounded to F16 (to nearest even, as f32_to_f16; a NaN stays a NaN).
inline void store_f16(uint16_t* p, v16f v) {
#if defined(__AVX512F__)
  // (The all-lanes zero-masked form: GCC 12 warns of its own undefined source in the plain one.)
  const __m256i h =
      _mm512_maskz_cvtps_ph(__mmask16(0xFFFF), reinterpret_cast<__m512>(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
#elif defined(__F16C__)
  const v8f lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const v8f hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(reinterpret_cast<__m256>(lo), _MM_FROUND_TO_NEAREST_INT));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(reinterpret_cast<__m256>(hi), _MM_FROUND_TO_NEAREST_INT));
#else
  for (int i = 0; i < 16; ++i) p[i] = f32_to_f16(v[i]);
#endif
}

// Sixteen int8 values converted to float (not yet scaled).
inline v16f load_i8(const int8_t* p) {
#if defined(__AVX512F__)
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  // Zero-masked forms, as in load_bf16 (the same instructions).
  return reinterpret_cast<v16f>(_mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_cvtepi8_epi32(0xffff, b)));
#elif defined(__AVX2__)
  return join(load8_i8(p), load8_i8(p + 8));
#else
  v16f f;
  for (int i = 0; i < 16; ++i) f[i] = static_cast<float>(p[i]);
  return f;
#endif
}

// a * b + c, fused where the ISA has FMA (one rounding), else two roundings.
inline v16f fma(v16f a, v16f b, v16f c) {
#if defined(__AVX512F__)
  return reinterpret_cast<v16f>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a),
                                                reinterpret_cast<__m512>(b),
                                                reinterpret_cast<__m512>(c)));
#elif defined(__FMA__)
  v8f alo = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7);
  v8f ahi = __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  v8f blo = __builtin_shufflevector(b, b, 0, 1, 2, 3, 4, 5, 6, 7);
  v8f bhi = __builtin_shufflevector(b, b, 8, 9, 10, 11, 12, 13, 14, 15);
  v8f clo = __builtin_shufflevector(c, c, 0, 1, 2, 3, 4, 5, 6, 7);
  v8f chi = __builtin_shufflevector(c, c, 8, 9, 10, 11, 12, 13, 14, 15);
  v8f lo = reinterpret_cast<v8f>(_mm256_fmadd_ps(reinterpret_cast<__m256>(alo),
                                                 reinterpret_cast<__m256>(blo),
                                                 reinterpret_cast<__m256>(clo)));
  v8f hi = reinterpret_cast<v8f>(_mm256_fmadd_ps(reinterpret_cast<__m256>(ahi),
                                                 reinterpret_cast<__m256>(bhi),
                                                 reinterpret_cast<__m256>(chi)));
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  return a * b + c;
#endif
}

// Sum of all lanes of the v16f whose lanes are lo then hi, in a fixed tree order.
inline float reduce_add(v8f lo, v8f hi) {
  const v8f s8 = lo + hi;
  v4f c = __builtin_shufflevector(s8, s8, 0, 1, 2, 3);
  v4f d = __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  v4f s4 = c + d;
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// Sum of all lanes in a fixed tree order.
inline float reduce_add(v16f v) {
  return reduce_add(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                    __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

// reduce_add of four vectors at once, into out[0..3]: the same additions in the same
// tree as reduce_add on each (so the same bits), with the partial sums of several vectors
// packed into one register at each level.
inline void reduce_add4(v16f a, v16f b, v16f c, v16f d, float* out) {
  // level 1: lane l + lane l+8. ab = [a0..7 | b0..7], cd likewise.
  const v16f ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                  __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const v16f cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                  __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  // level 2: lane l + lane l+4 of each 8. q = [a0..3 | b0..3 | c0..3 | d0..3]
  const v16f q = __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                 __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  // level 3: lane l + lane l+2 of each 4. r = [a0 a1 | b0 b1 | c0 c1 | d0 d1]
  const v8f r = __builtin_shufflevector(q, q, 0, 1, 4, 5, 8, 9, 12, 13) +
                __builtin_shufflevector(q, q, 2, 3, 6, 7, 10, 11, 14, 15);
  // level 4: lane l + lane l+1.
  const v4f t = __builtin_shufflevector(r, r, 0, 2, 4, 6) + __builtin_shufflevector(r, r, 1, 3, 5, 7);
  std::memcpy(out, &t, sizeof t);
}

// e^x for every lane, within 2 ulp of the exact value over the whole float range
// (Cody-Waite reduction by ln 2, degree-6 polynomial, exact scaling by 2^n).
inline v16f exp(v16f x) {
  const v16f hi = splat(88.7228394f), lo = splat(-103.972084f);
  x = x > hi ? hi : x;
  const v16i underflow = x < lo;
  const v16f n = __builtin_convertvector(__builtin_convertvector(x * splat(1.44269504f) +
                                                                     (x >= 0 ? splat(0.5f) : splat(-0.5f)),
                                                                 v16i),
                                         v16f);
  v16f r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  v16f p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
#if defined(__AVX512F__)
  // p 2^n, rounded once (the same value as the two exact halves below give). The
  // zero-masked form: the plain one makes GCC 12 warn about its undefined source.
  const v16f out =
      reinterpret_cast<v16f>(_mm512_maskz_scalef_ps(0xffff, reinterpret_cast<__m512>(p), reinterpret_cast<__m512>(n)));
#else
  // 2^n in two halves, so that n down to -150 (subnormal results) scales exactly enough.
  const v16i ni = __builtin_convertvector(n, v16i);
  const v16i n1 = ni / 2, n2 = ni - n1;
  v16f s1, s2;
  const v16i b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  const v16f out = p * s1 * s2;
#endif
  v16f zero{};
  return underflow ? zero : out;
}

inline float reduce_max(v16f v) {
  float m = v[0];
  for (int i = 1; i < 16; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

}  // namespace troupe::simd
