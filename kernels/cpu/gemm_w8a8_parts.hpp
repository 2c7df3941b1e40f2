// The pieces the files of gemm_w8a8 share: the packed layout's constants, the instruction
// sets the kernels are compiled for, the helpers with which both the VNNI and the AMX
// kernels read packed records, and the kernels' entry points. Private to
// kernels/cpu/gemm_w8a8*.cpp; everyone else includes gemm_w8a8.hpp.
#pragma once

// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (_mm512_undefined_*, GCC
// bug 105593): a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/gemm_w8a8.hpp"

namespace troupe::w8a8 {

constexpr int block = 16;           // rows of a packed block; tokens of an AMX tile
constexpr int vnni_tokens = q8_activations::interleave;  // tokens per pass of the VNNI kernel
constexpr int amx_min_tokens = 5;   // fewer go through VNNI: a tile's 16 would mostly idle

#define TROUPE_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))
#define TROUPE_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,fma")))

// The variable is set to something other than "" or "0".
bool env_set(const char* name);

// Packed weights are read front to back: bytes [p + ahead, p + ahead + n) are fetched
// now, so they are in the cache when their turn comes.
constexpr int64_t prefetch_distance = 4096;
inline void prefetch_ahead(const int8_t* p, int64_t n) {
  for (int64_t off = 0; off < n; off += 64) __builtin_prefetch(p + prefetch_distance + off);
}

// Rows of block b inside [rb, re), as a store mask.
inline __mmask16 row_mask(int32_t b, int32_t rb, int32_t re) {
  const int32_t lo = std::max(0, rb - b * block), hi = std::min(block, re - b * block);
  return static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
}


// A record's sixteen scales.
template <bool Compact>
TROUPE_VNNI inline __m512 record_scales(const q8_packed& w, int32_t b, int32_t g) {
  if constexpr (Compact)
    return _mm512_cvtph_ps(_mm256_load_si256(static_cast<const __m256i*>(w.scales(b, g))));
  else
    return _mm512_load_ps(static_cast<const float*>(w.scales(b, g)));
}

// Block b's scales, which lie past its values (those stream through prefetch_ahead), a few
// groups ahead of group g: at g == 0 the first eight groups', then one group's at a time,
// so that no burst of requests holds up the arithmetic.
inline void prefetch_scales(const q8_packed& w, int32_t b, int32_t g) {
  const auto* s = static_cast<const int8_t*>(w.scales(b, 0));
  const int64_t per = 16 * w.scale_bytes(), total = w.groups * per;
  if (g == 0) {
    for (int64_t off = 0; off < std::min<int64_t>(total, 8 * per); off += 64) __builtin_prefetch(s + off);
  } else if ((g + 7) * per < total) {
    __builtin_prefetch(s + (g + 7) * per);
  }
}

// 128 in every byte: dpbusd of it with a quad of weights adds 128 times their sum (see
// rows_vnni).
TROUPE_VNNI inline __m512i bytes_128() { return _mm512_set1_epi32(static_cast<int32_t>(0x80808080u)); }

// Tokens [t, num_tokens) against rows [rb, re) with VNNI, t a multiple of vnni_tokens,
// fetching the weights of rows up to fetch_end ahead of their turn (gemm_w8a8_vnni.cpp).
void rows_vnni_from(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, int32_t fetch_end,
                    int32_t t, float* y, int64_t ys);

// Tokens from 0 in blocks of 16 against rows [rb, re) with AMX tiles; returns the first
// token left for VNNI, a multiple of vnni_tokens (gemm_w8a8_amx.cpp).
TROUPE_AMX int32_t tokens_amx(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, float* y,
                              int64_t ys);

}  // namespace troupe::w8a8
