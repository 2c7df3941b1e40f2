// The AVX-512 VNNI kernels: up to eight tokens a pass against one or two blocks of 16 rows.
#include <cstring>

#include "kernels/cpu/gemm_w8a8_parts.hpp"

namespace troupe::w8a8 {

namespace {

// MT tokens from t0 (a multiple of vnni_tokens), sixteen rows per vector, groups of Q
// column quads: a group's products accumulate over its quads with one VNNI instruction
// per quad and token. The activations are offset to unsigned bytes, (x + 128) . w =
// x . w + 128 sum(w): one more VNNI instruction per quad, shared by the tokens, sums
// 128 sum(w) from the same weights (bytes_128), and its difference is x . w exactly.
// The tokens' bytes of one quad lie side by side (q8_activations::quads), so every
// broadcast is one pointer plus a constant.
template <int MT, int Q, bool Compact>
TROUPE_VNNI void rows_vnni(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, int32_t t0, float* y,
                           int64_t ys) {
  for (int32_t b = rb / block; b * block < re; ++b) {
    __m512 acc[MT];
    for (int t = 0; t < MT; ++t) acc[t] = _mm512_setzero_ps();
    const uint8_t* xg = a.quads(t0);
    const float* xs = a.block_scales(t0 - t0 % block, 0) + t0 % block;
    for (int32_t g = 0; g < a.groups; ++g, xg += Q * 4 * vnni_tokens, xs += block) {
      const int8_t* wt = w.tile(b, g);
      prefetch_ahead(wt, w.values_bytes());
      prefetch_scales(w, b, g);
      __m512i p[MT], offset = _mm512_setzero_si512();
      for (int t = 0; t < MT; ++t) p[t] = _mm512_setzero_si512();
#pragma GCC unroll 16
      for (int j = 0; j < Q; ++j) {
        const __m512i wv = _mm512_load_si512(wt + j * 64);
        offset = _mm512_dpbusd_epi32(offset, bytes_128(), wv);
        for (int t = 0; t < MT; ++t) {
          int32_t xq;
          std::memcpy(&xq, xg + (j * vnni_tokens + t) * 4, 4);
          p[t] = _mm512_dpbusd_epi32(p[t], _mm512_set1_epi32(xq), wv);
        }
      }
      const __m512 ws = record_scales<Compact>(w, b, g);
      for (int t = 0; t < MT; ++t) {
        const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(p[t], offset)), ws);
        acc[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(xs[t]), acc[t]);
      }
    }
    const __mmask16 m = row_mask(b, rb, re);
    for (int t = 0; t < MT; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * ys + b * block, m, acc[t]);
  }
}

// Bytes the pair kernel asks for while it works, per_group of them in each group from
// `from` on (in step with its reads, so that the requests never queue up).
struct fetch_plan {
  const int8_t* from = nullptr;
  int32_t per_group = 0;
};

// MT tokens from t0 against two row blocks at a time, b and b + 1: each activation quad,
// broadcast once, feeds both blocks' sums, so 2 * MT sums advance independently (eight
// chains of dependent VNNI instructions, each fed from memory, reach about 4.0 a ns on
// this CPU class; sixteen sharing eight broadcasts, about 5.6). The same sums and folds as
// rows_vnni, so the same bits. (Its own code rather than rows_vnni with a block count as a
// template parameter: that generic form ran 16-sequence decode and prefill about 8% slower.)
// The rows' 128 sum(w) per group are the same in every pass over the pair: the first pass
// (Known false) sums them into `offsets` ([group][block of the pair][16]), the later ones
// read them back.
template <int MT, int Q, bool Compact, bool Known>
TROUPE_VNNI void rows_vnni_pair(const q8_activations& a, const q8_packed& w, int32_t b, int32_t rb, int32_t re,
                                int32_t t0, float* y, int64_t ys, const fetch_plan& fetch, int32_t* offsets) {
  __m512 acc[MT][2];
  for (int t = 0; t < MT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  const uint8_t* xg = a.quads(t0);
  const float* xs = a.block_scales(t0 - t0 % block, 0) + t0 % block;
  for (int32_t g = 0; g < a.groups; ++g, xg += Q * 4 * vnni_tokens, xs += block) {
    const int8_t* w0 = w.tile(b, g);
    const int8_t* w1 = w.tile(b + 1, g);
    if constexpr (!Known) {  // (the later passes find them in L1)
      prefetch_scales(w, b, g);
      prefetch_scales(w, b + 1, g);
    }
    // Into L2 (the L1 holds this pair for the later passes).
    for (int32_t off = 0; off < fetch.per_group; off += 64)
      __builtin_prefetch(fetch.from + int64_t{g} * fetch.per_group + off, 0, 1);
    int32_t* const known = offsets + int64_t{g} * 2 * block;
    __m512i p[MT][2], offset0 = _mm512_setzero_si512(), offset1 = _mm512_setzero_si512();
    if constexpr (Known) {
      offset0 = _mm512_load_si512(known);
      offset1 = _mm512_load_si512(known + block);
    }
    for (int t = 0; t < MT; ++t) p[t][0] = p[t][1] = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int j = 0; j < Q; ++j) {
      const __m512i wv0 = _mm512_load_si512(w0 + j * 64), wv1 = _mm512_load_si512(w1 + j * 64);
      if constexpr (!Known) {
        offset0 = _mm512_dpbusd_epi32(offset0, bytes_128(), wv0);
        offset1 = _mm512_dpbusd_epi32(offset1, bytes_128(), wv1);
      }
      for (int t = 0; t < MT; ++t) {
        int32_t xq;
        std::memcpy(&xq, xg + (j * vnni_tokens + t) * 4, 4);
        const __m512i xv = _mm512_set1_epi32(xq);
        p[t][0] = _mm512_dpbusd_epi32(p[t][0], xv, wv0);
        p[t][1] = _mm512_dpbusd_epi32(p[t][1], xv, wv1);
      }
    }
    if constexpr (!Known) {
      _mm512_store_si512(known, offset0);
      _mm512_store_si512(known + block, offset1);
    }
    const __m512 ws0 = record_scales<Compact>(w, b, g), ws1 = record_scales<Compact>(w, b + 1, g);
    for (int t = 0; t < MT; ++t) {
      const __m512 x = _mm512_set1_ps(xs[t]);
      acc[t][0] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(p[t][0], offset0)), ws0), x, acc[t][0]);
      acc[t][1] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(p[t][1], offset1)), ws1), x, acc[t][1]);
    }
  }
  const __mmask16 m0 = row_mask(b, rb, re), m1 = row_mask(b + 1, rb, re);
  for (int t = 0; t < MT; ++t) {
    _mm512_mask_storeu_ps(y + (t0 + t) * ys + b * block, m0, acc[t][0]);
    _mm512_mask_storeu_ps(y + (t0 + t) * ys + (b + 1) * block, m1, acc[t][1]);
  }
}

// One pass of `count` tokens (1 to vnni_tokens) from t over rows [rb, re), which lie in
// one pair of row blocks from b (the pair kernel, taking its fetch plan and the pair's
// offsets, known after its first pass) or in block b alone.
template <int Q, bool Compact>
void rows_vnni_pass(const q8_activations& a, const q8_packed& w, bool pair, int32_t b, int32_t rb, int32_t re,
                    int32_t t, int32_t count, float* y, int64_t ys, const fetch_plan& fetch, int32_t* offsets,
                    bool known) {
  static_assert(vnni_tokens == 8, "the passes below go up to eight tokens");
  switch (count * 2 + pair) {
#define TROUPE_PASS(MT)                                                                                  \
  case (MT) * 2 + 1:                                                                                     \
    return known ? rows_vnni_pair<MT, Q, Compact, true>(a, w, b, rb, re, t, y, ys, fetch, offsets)       \
                 : rows_vnni_pair<MT, Q, Compact, false>(a, w, b, rb, re, t, y, ys, fetch, offsets);     \
  case (MT) * 2: return rows_vnni<MT, Q, Compact>(a, w, rb, re, t, y, ys);
    TROUPE_PASS(1) TROUPE_PASS(2) TROUPE_PASS(3) TROUPE_PASS(4) TROUPE_PASS(5) TROUPE_PASS(6) TROUPE_PASS(7)
    TROUPE_PASS(8)
#undef TROUPE_PASS
    default: TROUPE_ASSERT(false, count);
  }
}

// Tokens [t, num_tokens) against rows [rb, re), t a multiple of vnni_tokens. One token
// goes block by block (a matrix-vector product waits on memory, not on arithmetic).
// More go a pair of row blocks at a time (a last odd block alone), every pass of up to
// eight tokens over the pair before the next pair: the pair's weights come from memory
// once and stay in L1 for the later passes. Meanwhile the passes fetch the next pair's
// weights, spread evenly over all of them, so that memory streams beside the arithmetic
// of every pass rather than only the first one's.
template <int Q, bool Compact>
void rows_vnni_from(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, int32_t fetch_end,
                    int32_t t, float* y, int64_t ys) {
  const int32_t tokens = a.num_tokens - t;
  if (tokens == 1) return rows_vnni<1, Q, Compact>(a, w, rb, re, t, y, ys);
  const int32_t passes = (tokens + vnni_tokens - 1) / vnni_tokens;
  const int32_t b_end = (re + block - 1) / block, fetch_b_end = (fetch_end + block - 1) / block;
  const int64_t block_bytes = w.block_bytes;
  thread_local aligned_vector<int32_t> offsets;
  offsets.resize(static_cast<size_t>(a.groups) * 2 * block);
  for (int32_t b = rb / block; b < b_end; b += 2) {
    const bool pair = b + 2 <= b_end;
    const int32_t lo = std::max(b * block, rb), hi = std::min((b + 2) * block, re);
    // The next pair, up to fetch_end (past it, the rows may be another thread's).
    const int64_t next = std::max(0, std::min(b + 4, fetch_b_end) - (b + 2)) * block_bytes;
    const int64_t share = (next / passes + 63) / 64 * 64;
    for (int32_t p = 0; p < passes; ++p) {
      fetch_plan fetch;
      if (next > p * share) {
        fetch.from = w.tile(b + 2, 0) + p * share;
        const int64_t bytes = std::min(share, next - p * share);
        fetch.per_group = static_cast<int32_t>(((bytes + a.groups - 1) / a.groups + 63) / 64 * 64);
      }
      const int32_t u = t + p * vnni_tokens;
      rows_vnni_pass<Q, Compact>(a, w, pair, b, lo, hi, u, std::min(vnni_tokens, a.num_tokens - u), y, ys, fetch,
                                 offsets.data(), p > 0);
    }
  }
}

}  // namespace

void rows_vnni_from(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, int32_t fetch_end,
                    int32_t t, float* y, int64_t ys) {
  if (t >= a.num_tokens) return;  // (the AMX kernel took them all, a last partial block too)
  TROUPE_ASSERT(t % vnni_tokens == 0, t);
  switch ((a.group == 32 ? 2 : 0) + w.compact) {
    case 3: return rows_vnni_from<8, true>(a, w, rb, re, fetch_end, t, y, ys);
    case 2: return rows_vnni_from<8, false>(a, w, rb, re, fetch_end, t, y, ys);
    case 1: return rows_vnni_from<16, true>(a, w, rb, re, fetch_end, t, y, ys);
    default: return rows_vnni_from<16, false>(a, w, rb, re, fetch_end, t, y, ys);
  }
}

}  // namespace troupe::w8a8
