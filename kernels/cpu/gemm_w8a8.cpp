#include "kernels/cpu/gemm_w8a8.hpp"

#include <cpuid.h>
// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (_mm512_undefined_*, GCC
// bug 105593): a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace troupe {

namespace {

constexpr int block = 16;           // rows of a packed block; tokens of an AMX tile
constexpr int vnni_tokens = q8_activations::interleave;  // tokens per pass of the VNNI kernel
constexpr int amx_min_tokens = 5;   // fewer go through VNNI: a tile's 16 would mostly idle

// Linux: tile data is off until a process asks for it.
constexpr long arch_req_xcomp_perm = 0x1023;
constexpr long xfeature_xtiledata = 18;

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// AVX-512 (F, BW, VL) with VNNI, F16C, and the OS saving AVX-512 state.
bool detect_vnni() {
  if (env_set("TROUPE_NO_W8A8")) return false;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((b >> 16 & 1) && (b >> 30 & 1) && (b >> 31 & 1) && (c >> 11 & 1))) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1) || !(c >> 29 & 1)) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xE6) == 0xE6;
}

bool detect_amx() {
  if (!detect_vnni() || env_set("TROUPE_NO_AMX")) return false;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 25 & 1)) return false;  // TILE, INT8
  return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
}

// One group's step, the definition every kernel follows.
inline float accumulate(float acc, int32_t isum, float w_scale, float x_scale) {
  const float v = static_cast<float>(isum) * w_scale;
  return std::fma(v, x_scale, acc);
}

void rows_scalar(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, float* y, int64_t ys) {
  for (int32_t r = rb; r < re; ++r)
    for (int32_t t = 0; t < a.num_tokens; ++t) {
      float acc = 0.0f;
      for (int32_t g = 0; g < a.groups; ++g) {
        int32_t isum = 0;
        for (int32_t k = g * a.group; k < (g + 1) * a.group; ++k) isum += int32_t{a.at(t, k)} * int32_t{w.at(r, k)};
        acc = accumulate(acc, isum, w.scale_at(r, g), a.scale_at(t, g));
      }
      y[t * ys + r] = acc;
    }
}

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

#define TROUPE_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

// A record's sixteen scales and the start of its sums, -128 sum(w) (see rows_vnni).
template <bool Compact>
TROUPE_VNNI inline __m512 record_scales(const q8_packed& w, int32_t b, int32_t g) {
  if constexpr (Compact)
    return _mm512_cvtph_ps(_mm256_load_si256(static_cast<const __m256i*>(w.scales(b, g))));
  else
    return _mm512_load_ps(static_cast<const float*>(w.scales(b, g)));
}
template <bool Compact>
TROUPE_VNNI inline __m512i record_start(const q8_packed& w, int32_t b, int32_t g) {
  __m512i sums;
  if constexpr (Compact)
    sums = _mm512_cvtepi16_epi32(_mm256_load_si256(static_cast<const __m256i*>(w.sums(b, g))));
  else
    sums = _mm512_load_si512(w.sums(b, g));
  return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sums, 7));
}

// MT tokens from t0 (a multiple of vnni_tokens), sixteen rows per vector, groups of Q
// column quads: a group's products accumulate over its quads with one VNNI instruction
// per quad and token. The activations are offset to unsigned bytes, (x + 128) . w =
// x . w + 128 sum(w), so each group's sums start from -128 sum(w) and end as x . w
// exactly. The tokens' bytes of one quad lie side by side (q8_activations::quads), so
// every broadcast is one pointer plus a constant.
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
      prefetch_ahead(wt, w.record_bytes());
      const __m512i start = record_start<Compact>(w, b, g);
      __m512i p[MT];
      for (int t = 0; t < MT; ++t) p[t] = start;
#pragma GCC unroll 16
      for (int j = 0; j < Q; ++j) {
        const __m512i wv = _mm512_load_si512(wt + j * 64);
        for (int t = 0; t < MT; ++t) {
          int32_t xq;
          std::memcpy(&xq, xg + (j * vnni_tokens + t) * 4, 4);
          p[t] = _mm512_dpbusd_epi32(p[t], _mm512_set1_epi32(xq), wv);
        }
      }
      const __m512 ws = record_scales<Compact>(w, b, g);
      for (int t = 0; t < MT; ++t) {
        const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(p[t]), ws);
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
template <int MT, int Q, bool Compact>
TROUPE_VNNI void rows_vnni_pair(const q8_activations& a, const q8_packed& w, int32_t b, int32_t rb, int32_t re,
                                int32_t t0, float* y, int64_t ys, const fetch_plan& fetch) {
  __m512 acc[MT][2];
  for (int t = 0; t < MT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  const uint8_t* xg = a.quads(t0);
  const float* xs = a.block_scales(t0 - t0 % block, 0) + t0 % block;
  for (int32_t g = 0; g < a.groups; ++g, xg += Q * 4 * vnni_tokens, xs += block) {
    const int8_t* w0 = w.tile(b, g);
    const int8_t* w1 = w.tile(b + 1, g);
    // Into L2 (the L1 holds this pair for the later passes).
    for (int32_t off = 0; off < fetch.per_group; off += 64)
      __builtin_prefetch(fetch.from + int64_t{g} * fetch.per_group + off, 0, 1);
    const __m512i start0 = record_start<Compact>(w, b, g), start1 = record_start<Compact>(w, b + 1, g);
    __m512i p[MT][2];
    for (int t = 0; t < MT; ++t) {
      p[t][0] = start0;
      p[t][1] = start1;
    }
#pragma GCC unroll 16
    for (int j = 0; j < Q; ++j) {
      const __m512i wv0 = _mm512_load_si512(w0 + j * 64), wv1 = _mm512_load_si512(w1 + j * 64);
      for (int t = 0; t < MT; ++t) {
        int32_t xq;
        std::memcpy(&xq, xg + (j * vnni_tokens + t) * 4, 4);
        const __m512i xv = _mm512_set1_epi32(xq);
        p[t][0] = _mm512_dpbusd_epi32(p[t][0], xv, wv0);
        p[t][1] = _mm512_dpbusd_epi32(p[t][1], xv, wv1);
      }
    }
    const __m512 ws0 = record_scales<Compact>(w, b, g), ws1 = record_scales<Compact>(w, b + 1, g);
    for (int t = 0; t < MT; ++t) {
      const __m512 x = _mm512_set1_ps(xs[t]);
      acc[t][0] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(p[t][0]), ws0), x, acc[t][0]);
      acc[t][1] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(p[t][1]), ws1), x, acc[t][1]);
    }
  }
  const __mmask16 m0 = row_mask(b, rb, re), m1 = row_mask(b + 1, rb, re);
  for (int t = 0; t < MT; ++t) {
    _mm512_mask_storeu_ps(y + (t0 + t) * ys + b * block, m0, acc[t][0]);
    _mm512_mask_storeu_ps(y + (t0 + t) * ys + (b + 1) * block, m1, acc[t][1]);
  }
}

// One pass of `count` tokens (1 to vnni_tokens) from t over rows [rb, re), which lie in
// one pair of row blocks from b (the pair kernel, taking its fetch plan) or in block b
// alone.
template <int Q, bool Compact>
void rows_vnni_pass(const q8_activations& a, const q8_packed& w, bool pair, int32_t b, int32_t rb, int32_t re,
                    int32_t t, int32_t count, float* y, int64_t ys, const fetch_plan& fetch) {
  static_assert(vnni_tokens == 8, "the passes below go up to eight tokens");
  switch (count * 2 + pair) {
#define TROUPE_PASS(MT)                                                           \
  case (MT) * 2 + 1: return rows_vnni_pair<MT, Q, Compact>(a, w, b, rb, re, t, y, ys, fetch); \
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
  const int64_t block_bytes = a.groups * w.record_bytes();
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
      rows_vnni_pass<Q, Compact>(a, w, pair, b, lo, hi, u, std::min(vnni_tokens, a.num_tokens - u), y, ys, fetch);
    }
  }
}

void rows_vnni_from(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, int32_t fetch_end,
                    int32_t t, float* y, int64_t ys) {
  TROUPE_ASSERT(t % vnni_tokens == 0, t);
  if (t >= a.num_tokens) return;
  switch ((a.group == 32 ? 2 : 0) + w.compact) {
    case 3: return rows_vnni_from<8, true>(a, w, rb, re, fetch_end, t, y, ys);
    case 2: return rows_vnni_from<8, false>(a, w, rb, re, fetch_end, t, y, ys);
    case 1: return rows_vnni_from<16, true>(a, w, rb, re, fetch_end, t, y, ys);
    default: return rows_vnni_from<16, false>(a, w, rb, re, fetch_end, t, y, ys);
  }
}

// A tile of products (16 tokens x 16 rows) of one group into the tokens' accumulators,
// with the rows' and the tokens' scales of that group.
TROUPE_VNNI inline void fold_products(const int32_t* pr, __m512 ws, const float* x_scales, __m512* acc) {
  for (int i = 0; i < block; ++i) {
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(pr + i * block)), ws);
    acc[i] = _mm512_fmadd_ps(v, _mm512_set1_ps(x_scales[i]), acc[i]);
  }
}

struct alignas(64) tile_config {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

#define TROUPE_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,fma")))

// Group g's int32 products, 16 tokens x 16 rows, into tile C from activations in tile X
// and weights in tile W. (Macros: GCC's tile intrinsics spell the tile's number into the
// instruction.)
#define TROUPE_TILE_MULTIPLY(C, X, W, x, x_stride, wt) \
  do {                                                 \
    _tile_loadd(X, x, x_stride);                       \
    _tile_loadd(W, wt, block * 4);                     \
    _tile_zero(C);                                     \
    _tile_dpbssd(C, X, W);                             \
  } while (0)

// A tile store waits for the multiply that fills it and holds up the instructions behind
// it, and the tiles are not renamed. So the work on a unit (one group of one 16-token
// block and one 16-row block) is spread over three steps: step u multiplies unit u (into
// the next of four product tiles), step u + store_lag stores the product (after three
// more multiplies have started), and step u + store_lag + fold_lag folds it into the
// accumulators. The units of a call form one sequence (row blocks, then token blocks,
// then groups), so the pipeline fills and drains once per call, not once per block.
// Products wait in a ring of fold_ring tiles.
constexpr int store_lag = 3;
constexpr int fold_lag = 2;
constexpr int fold_ring = 8;
static_assert(store_lag + fold_lag < fold_ring && (fold_ring & (fold_ring - 1)) == 0);

// The sums of a block of tokens into y (rows [0, tokens) of it, columns by mask m), and
// the accumulators back to zero.
TROUPE_VNNI inline void write_rows(__m512 (&acc)[block], float* y, int64_t ys, __mmask16 m, int32_t tokens) {
#define TROUPE_ROW(i)                                                  \
  if ((i) < tokens) _mm512_mask_storeu_ps(y + (i) * ys, m, acc[i]); \
  acc[i] = _mm512_setzero_ps();
  TROUPE_ROW(0) TROUPE_ROW(1) TROUPE_ROW(2) TROUPE_ROW(3) TROUPE_ROW(4) TROUPE_ROW(5) TROUPE_ROW(6) TROUPE_ROW(7)
  TROUPE_ROW(8) TROUPE_ROW(9) TROUPE_ROW(10) TROUPE_ROW(11) TROUPE_ROW(12) TROUPE_ROW(13) TROUPE_ROW(14) TROUPE_ROW(15)
#undef TROUPE_ROW
}

// Where a unit is: row block, first token, group.
struct unit_cursor {
  int32_t b, t0, g;
};

// Tokens in blocks of 16. Tiles 0, 3, 6 and 7 take the products of units in turn, 1 and
// 4 the activations of even and odd units, 2 and 5 their weights.
TROUPE_AMX int32_t tokens_amx(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, float* y,
                              int64_t ys) {
  // Whole blocks of 16 tokens, and a last partial one if it is worth a tile (the
  // activations are zero-padded to whole blocks).
  const int32_t rest = a.num_tokens % block;
  const int32_t upto = rest >= amx_min_tokens ? a.num_tokens - rest + block : a.num_tokens - rest;
  if (upto == 0) return 0;
  tile_config cfg;
  for (int c : {0, 3, 6, 7}) {
    cfg.rows[c] = block;
    cfg.colsb[c] = block * 4;
  }
  for (int c : {1, 4}) {
    cfg.rows[c] = block;
    cfg.colsb[c] = static_cast<uint16_t>(a.group);
  }
  for (int c : {2, 5}) {
    cfg.rows[c] = static_cast<uint8_t>(a.group / 4);
    cfg.colsb[c] = block * 4;
  }
  _tile_loadconfig(&cfg);
  alignas(64) int32_t ring[fold_ring][block * block];
  const int32_t groups = a.groups, grp = a.group;
  const int64_t xs = a.cols;
  const int32_t b_first = rb / block, b_end = (re + block - 1) / block;
  const int64_t units = int64_t{b_end - b_first} * (upto / block) * groups;
  const auto advance = [&](unit_cursor& c) {
    if (++c.g == groups) {
      c.g = 0;
      c.t0 += block;
      if (c.t0 == upto) {
        c.t0 = 0;
        ++c.b;
      }
    }
  };
  unit_cursor mul{b_first, 0, 0}, fold{b_first, 0, 0};
  // Indexed by constants only (the loops unrolled), so that the accumulators live in
  // registers.
  __m512 acc[block];
#pragma GCC unroll 16
  for (int i = 0; i < block; ++i) acc[i] = _mm512_setzero_ps();

  // The weights stream in order: fetch ahead of the tile loads (the first pass over a
  // block; later token blocks find it in the cache).
#define TROUPE_MULTIPLY(C, X, W)                                                               \
  do {                                                                                         \
    const int8_t* wt_ = w.tile(mul.b, mul.g);                                                  \
    if (mul.t0 == 0) prefetch_ahead(wt_, w.record_bytes());                                    \
    TROUPE_TILE_MULTIPLY(C, X, W, a.q.data() + int64_t{mul.t0} * xs + mul.g * grp, xs, wt_); \
    advance(mul);                                                                              \
  } while (0)
#define TROUPE_STORE(C, u) _tile_stored(C, ring[(u) % fold_ring], block * 4)
  // Folds unit u, and writes its block's sums out after its last group.
#define TROUPE_FOLD(u)                                                                                    \
  do {                                                                                                    \
    const __m512 ws_ = w.compact ? record_scales<true>(w, fold.b, fold.g)                                 \
                                 : record_scales<false>(w, fold.b, fold.g);                               \
    fold_products(ring[(u) % fold_ring], ws_, a.block_scales(fold.t0, fold.g), acc);                      \
    if (fold.g == groups - 1) {                                                                           \
      const __mmask16 m = row_mask(fold.b, rb, re);                                                       \
      write_rows(acc, y + int64_t{fold.t0} * ys + fold.b * block, ys, m, a.num_tokens - fold.t0);        \
    }                                                                                                     \
    advance(fold);                                                                                        \
  } while (0)
  // Step s: fold unit s - store_lag - fold_lag, multiply unit s, store unit s - store_lag.
  // (A macro, not a lambda: the accumulators must stay in registers.)
  constexpr int32_t lag = store_lag + fold_lag;
#define TROUPE_STEP(s)                                                  \
  do {                                                                  \
    if ((s) >= lag && (s) - lag < units) TROUPE_FOLD((s) - lag);        \
    if ((s) < units) switch ((s) & 3) {                                 \
        case 0: TROUPE_MULTIPLY(0, 1, 2); break;                        \
        case 1: TROUPE_MULTIPLY(3, 4, 5); break;                        \
        case 2: TROUPE_MULTIPLY(6, 1, 2); break;                        \
        default: TROUPE_MULTIPLY(7, 4, 5); break;                       \
      }                                                                 \
    if (const int64_t u_ = (s) - store_lag; u_ >= 0 && u_ < units)      \
      switch (u_ & 3) {                                                 \
        case 0: TROUPE_STORE(0, u_); break;                             \
        case 1: TROUPE_STORE(3, u_); break;                             \
        case 2: TROUPE_STORE(6, u_); break;                             \
        default: TROUPE_STORE(7, u_); break;                            \
      }                                                                 \
  } while (0)
  // From the first multiple of 4 at which every step folds, four steps at a time.
  constexpr int32_t steady = (lag + 3) / 4 * 4;
  int64_t s = 0;
  for (; s < std::min<int64_t>(steady, units + lag); ++s) TROUPE_STEP(s);
  static_assert(store_lag == 3, "the steady loop below spells the product tiles out for this lag");
  for (; s + 4 <= units; s += 4) {
    TROUPE_FOLD(s - lag);
    TROUPE_MULTIPLY(0, 1, 2);
    TROUPE_STORE(3, s - 3);
    TROUPE_FOLD(s + 1 - lag);
    TROUPE_MULTIPLY(3, 4, 5);
    TROUPE_STORE(6, s - 2);
    TROUPE_FOLD(s + 2 - lag);
    TROUPE_MULTIPLY(6, 1, 2);
    TROUPE_STORE(7, s - 1);
    TROUPE_FOLD(s + 3 - lag);
    TROUPE_MULTIPLY(7, 4, 5);
    TROUPE_STORE(0, s);
  }
  for (; s < units + lag; ++s) TROUPE_STEP(s);
#undef TROUPE_STEP
#undef TROUPE_MULTIPLY
#undef TROUPE_STORE
#undef TROUPE_FOLD
  _tile_release();
  return std::min(upto, a.num_tokens);
}

}  // namespace

bool vnni_available() {
  static const bool yes = detect_vnni();
  return yes;
}

bool amx_available() {
  static const bool yes = detect_amx();
  return yes;
}

std::optional<w8a8_kernel> w8a8_kernel_in_use() {
  static const std::optional<w8a8_kernel> k = []() -> std::optional<w8a8_kernel> {
    if (amx_available()) return w8a8_kernel::amx;
    if (vnni_available()) return w8a8_kernel::vnni;
    const char* v = std::getenv("TROUPE_W8A8");
    if (v && std::strcmp(v, "scalar") == 0 && !env_set("TROUPE_NO_W8A8")) return w8a8_kernel::scalar;
    return std::nullopt;
  }();
  return k;
}

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

namespace {

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

void gemm_w8a8_rows(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, float* y, int64_t ys,
                    w8a8_kernel k, int32_t fetch_end) {
  TROUPE_ASSERT(a.group == w.group && a.cols == w.cols && 0 <= rb && rb <= re && re <= w.rows, a.group, w.group,
                a.cols, w.cols, rb, re, w.rows);
  TROUPE_ASSERT(k == w8a8_kernel::scalar || vnni_available(), "no VNNI on this CPU");
  TROUPE_ASSERT(k != w8a8_kernel::amx || amx_available(), "no AMX for this process");
  if (rb == re) return;
  if (k == w8a8_kernel::scalar) return rows_scalar(a, w, rb, re, y, ys);
  int32_t t = 0;
  if (k == w8a8_kernel::amx && a.num_tokens >= amx_min_tokens) t = tokens_amx(a, w, rb, re, y, ys);
  rows_vnni_from(a, w, rb, re, std::clamp(fetch_end, re, w.rows), t, y, ys);
}

}  // namespace troupe
