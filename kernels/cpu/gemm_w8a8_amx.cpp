// The AMX kernel: 16 tokens by 16 rows a tile multiply, for steps of amx_min_tokens or more.
#include "kernels/cpu/gemm_w8a8_parts.hpp"

namespace troupe::w8a8 {

namespace {

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

}  // namespace

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
    if (mul.t0 == 0) {                                                                         \
      prefetch_ahead(wt_, w.values_bytes());                                                   \
      prefetch_scales(w, mul.b, mul.g);                                                        \
    }                                                                                          \
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

}  // namespace troupe::w8a8
