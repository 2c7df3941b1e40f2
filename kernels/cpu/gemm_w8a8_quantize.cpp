// q8_activations::quantize: each token's activations to int8 per group, in the layouts
// the kernels read (gemm_w8a8.hpp).
#include <cmath>
#include <limits>

#include "kernels/cpu/gemm_w8a8_parts.hpp"

namespace troupe {

namespace {

using w8a8::block;
using w8a8::vnni_tokens;

// Where column k of a token's unsigned bytes goes, from the token's first column quad:
// quads of the eight tokens of its block lie side by side.
inline int64_t interleaved(int32_t k) { return int64_t{k / 4} * 4 * vnni_tokens + k % 4; }

// One token's groups: the definition (scalar), and the same values sixteen lanes at a time.
// Group g's scale goes to scale[g * block], the token's place in its block's layout, and
// its unsigned bytes to u[interleaved(column)]. A group holding a NaN or an infinity gets a
// NaN scale and zeros.
void quantize_scalar(const float* x, int32_t cols, int32_t grp, int8_t* q, uint8_t* u, float* scale) {
  for (int32_t g = 0; g < cols / grp; ++g) {
    const float* xg = x + g * grp;
    float amax = 0.0f;
    bool finite = true;
    for (int32_t k = 0; k < grp; ++k) {
      finite = finite && std::isfinite(xg[k]);
      amax = std::max(amax, std::fabs(xg[k]));
    }
    const float s = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    scale[g * block] = s;
    const bool usable = s > 0.0f && std::isfinite(s);
    for (int32_t k = 0; k < grp; ++k) {
      const float v = usable ? std::clamp(std::nearbyint(xg[k] / s), -127.0f, 127.0f) : 0.0f;
      q[g * grp + k] = static_cast<int8_t>(v);
      u[interleaved(g * grp + k)] = static_cast<uint8_t>(static_cast<int32_t>(v) + 128);
    }
  }
}

TROUPE_VNNI void quantize_vnni(const float* x, int32_t cols, int32_t grp, int8_t* q, uint8_t* u, float* scale) {
  const int chunks = grp / 16;
  const int32_t groups = cols / grp;
  const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
  const __m512i exponent = _mm512_set1_epi32(0x7F800000);
  // Sixteen groups at a time: their maxima first, then their scales and reciprocals in
  // one vector each, then their values, none of which waits on another group's scale.
  for (int32_t g0 = 0; g0 < groups; g0 += 16) {
    const int n = std::min<int32_t>(16, groups - g0);
    alignas(64) float amax[16] = {}, sc[16], rc[16];
    for (int i = 0; i < n; ++i) {
      const float* xg = x + (g0 + i) * grp;
      __m512 m = _mm512_setzero_ps();
      __mmask16 special = 0;  // lanes whose exponent is all ones: NaN or infinity
      for (int c = 0; c < chunks; ++c) {
        const __m512 v = _mm512_loadu_ps(xg + c * 16);
        special |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), exponent), exponent);
        m = _mm512_max_ps(m, _mm512_abs_ps(v));
      }
      amax[i] = special ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(m);
    }
    const __m512 s = _mm512_div_ps(_mm512_load_ps(amax), _mm512_set1_ps(127.0f));
    _mm512_store_ps(sc, s);
    // (Reciprocals only of scales the corrections below use; no division by zero.)
    _mm512_store_ps(rc, _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_max_ps(s, _mm512_set1_ps(0x1p-100f))));
    for (int i = 0; i < n; ++i) {
      const int32_t g = g0 + i;
      const float* xg = x + g * grp;
      scale[g * block] = sc[i];
      const bool usable = sc[i] > 0.0f && std::isfinite(sc[i]);
      // x / s, correctly rounded, from the reciprocal: q0 = x * RN(1 / s) lies within 1.5
      // ulps of x / s, one correction q + RN(x - s q) / s (the residual exact in an FMA)
      // brings it within one ulp, and by Markstein's theorem a second one gives RN(x / s)
      // itself: four FMA-unit operations instead of a division. The theorem wants no
      // overflow or underflow on the way, so scales outside [2^-100, 2^100] divide.
      const bool reciprocal = sc[i] >= 0x1p-100f && sc[i] <= 0x1p100f;
      const __m512 sv = _mm512_set1_ps(sc[i]), rv = _mm512_set1_ps(rc[i]);
      for (int c = 0; c < chunks; ++c) {
        // Rounded to nearest even by the conversion itself; |x / s| <= 127 (1 + 2^-23), so
        // the conversion's saturation to int8 never binds and stands for the clamp.
        __m128i qv = _mm_setzero_si128();
        if (usable) {
          const __m512 xv = _mm512_loadu_ps(xg + c * 16);
          __m512 quot;
          if (reciprocal) {
            quot = _mm512_mul_ps(xv, rv);
            quot = _mm512_fmadd_ps(_mm512_fnmadd_ps(quot, sv, xv), rv, quot);
            quot = _mm512_fmadd_ps(_mm512_fnmadd_ps(quot, sv, xv), rv, quot);
          } else {
            quot = _mm512_div_ps(xv, sv);
          }
          qv = _mm512_cvtsepi32_epi8(_mm512_cvt_roundps_epi32(quot, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * grp + c * 16), qv);
        // q + 128 as an unsigned byte is q with its top bit flipped; four column quads.
        const __m128i uv = _mm_xor_si128(qv, flip);
        uint8_t* uq = u + interleaved(g * grp + c * 16);
        _mm_storeu_si32(uq, uv);
        _mm_storeu_si32(uq + 4 * vnni_tokens, _mm_srli_si128(uv, 4));
        _mm_storeu_si32(uq + 8 * vnni_tokens, _mm_srli_si128(uv, 8));
        _mm_storeu_si32(uq + 12 * vnni_tokens, _mm_srli_si128(uv, 12));
      }
    }
  }
}

}  // namespace

void q8_activations::quantize(const float* x, int64_t x_stride, int32_t n, int32_t c, int32_t grp,
                              thread_pool* pool) {
  num_tokens = n;
  cols = c;
  group = grp;
  groups = c / grp;
  const int32_t padded = (n + block - 1) / block * block;
  q.resize(static_cast<size_t>(padded) * c);
  u.resize(static_cast<size_t>((n + vnni_tokens - 1) / vnni_tokens * vnni_tokens) * c);
  scale.resize(static_cast<size_t>(padded) * groups);
  std::fill(q.begin() + static_cast<int64_t>(n) * c, q.end(), 0);
  std::fill(scale.begin() + static_cast<int64_t>(n - n % block) * groups, scale.end(), 0.0f);
  const bool vector = vnni_available() && grp % 16 == 0;
  // Tokens [tb, te), groups [gb, ge).
  auto quantize_range = [&](int32_t tb, int32_t te, int64_t gb, int64_t ge) {
    const auto g0 = static_cast<int32_t>(gb), width = static_cast<int32_t>(ge - gb) * grp;
    for (int32_t t = tb; t < te; ++t) {
      const size_t at = static_cast<size_t>(t) * c + static_cast<size_t>(g0) * grp;
      uint8_t* ut = u.data() + int64_t{t - t % vnni_tokens} * c + t % vnni_tokens * 4 + interleaved(g0 * grp);
      float* s = scale.data() + (t - t % block) * groups + t % block + g0 * block;
      if (vector)
        quantize_vnni(x + t * x_stride + g0 * grp, width, grp, q.data() + at, ut, s);
      else
        quantize_scalar(x + t * x_stride + g0 * grp, width, grp, q.data() + at, ut, s);
    }
  };
  // Threads never write the same cache line: the scales of one group for sixteen tokens
  // share one. So many tokens go by sixteens, each thread reading whole rows of x front
  // to back (ranges of groups across them would read every row in strides, which the
  // hardware prefetchers do not follow, and wait on memory for most of the time); a few
  // go by ranges of groups, each covering 64 bytes of a token's q, and of its eight's u,
  // or more.
  if (pool && n >= 2 * block)
    pool->parallel_for((n + block - 1) / block, 1, [&](int64_t bb, int64_t be, int) {
      quantize_range(static_cast<int32_t>(bb * block), static_cast<int32_t>(std::min<int64_t>(n, be * block)), 0, groups);
    });
  else if (pool && n > 1)
    pool->parallel_for(groups, std::max(1, 64 / grp), [&](int64_t gb, int64_t ge, int) { quantize_range(0, n, gb, ge); });
  else
    quantize_range(0, n, 0, groups);
}

}  // namespace troupe
