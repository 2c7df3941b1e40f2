#include "kernels/cpu/gemm.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/common/aligned.hpp"
#include "kernels/cpu/gemm_w8a8.hpp"
#include "kernels/cpu/simd.hpp"

namespace troupe {

namespace {

using simd::v16f;
using simd::v8f;
constexpr int lanes = simd::width;
constexpr int tile_rows = 4;    // weight rows per register tile
constexpr int tile_tokens = 4;   // tokens per register tile reading weights directly
constexpr int panel_tokens = 6;  // tokens per register tile over a dequantized panel
// How far ahead weight rows are fetched: the next tile's, at the column being read. (Three
// tiles ahead, 36 KB of 768-column F32 rows and 96 KB of 2,048-column ones, is more than
// the 48 KB L1 holds, and single-stream F32 decode ran 10-13% slower.)
constexpr int prefetch_rows = tile_rows;

// Readers return sixteen dequantized weights of one row. chunk(r, k) requires
// k + 16 <= cols; tail(r, k, out) fills out with the columns from k to the end of the
// row, zero-padded, computing each value exactly as chunk() would.
void tail_generic(const matrix_view& w, int32_t r, int32_t k, float* out) {
  for (int i = 0; i < lanes; ++i) out[i] = k + i < w.cols ? w.at(r, k + i) : 0.0f;
}

// A reader's cursor(r) resolves row r once; cursor.chunk(k) then costs one load and a
// conversion.
struct f32_reader {
  static constexpr int step = lanes;
  const matrix_view& w;
  struct cursor {
    const float* p;
    v16f chunk(int32_t k) const { return simd::load(p + k); }
    void halves(int32_t k, v8f& lo, v8f& hi) const {
      lo = simd::load8(p + k);
      hi = simd::load8(p + k + 8);
    }
    void load(int32_t k, v16f* out) const { out[0] = chunk(k); }
    void prefetch(int32_t k, int64_t ahead) const {
      __builtin_prefetch(reinterpret_cast<const char*>(p + k) + ahead);
    }
  };
  int64_t row_bytes() const { return w.row_stride * 4; }
  cursor row(int32_t r) const { return {static_cast<const float*>(w.data) + r * w.row_stride}; }
};

// F16 and BF16: sixteen 16-bit values widened to float.
template <v16f (*Load)(const uint16_t*), v8f (*Load8)(const uint16_t*)>
struct half_reader {
  static constexpr int step = lanes;
  const matrix_view& w;
  struct cursor {
    const uint16_t* p;
    v16f chunk(int32_t k) const { return Load(p + k); }
    void halves(int32_t k, v8f& lo, v8f& hi) const {
      lo = Load8(p + k);
      hi = Load8(p + k + 8);
    }
    void load(int32_t k, v16f* out) const { out[0] = chunk(k); }
    void prefetch(int32_t k, int64_t ahead) const {
      if (k % 32 == 0) __builtin_prefetch(reinterpret_cast<const char*>(p + k) + ahead);
    }
  };
  int64_t row_bytes() const { return w.row_stride * 2; }
  cursor row(int32_t r) const { return {static_cast<const uint16_t*>(w.data) + r * w.row_stride}; }
};
using f16_reader = half_reader<simd::load_f16, simd::load8_f16>;
using bf16_reader = half_reader<simd::load_bf16, simd::load8_bf16>;

// load() yields a whole group, so its scale is read once.
template <int GroupSize, bool ScaleF16>
struct q8_reader {
  static constexpr int step = GroupSize;
  const matrix_view& w;
  struct cursor {
    const int8_t* q;
    const uint8_t* s;
    int64_t q_group_stride, s_group_stride;
    float scale(int32_t g) const {
      const uint8_t* sg = s + g * s_group_stride;
      if constexpr (ScaleF16) {
        uint16_t h;
        std::memcpy(&h, sg, 2);
        return f16_to_f32(h);
      } else {
        float f;
        std::memcpy(&f, sg, 4);
        return f;
      }
    }
    v16f chunk(int32_t k) const {
      const int32_t g = k / GroupSize;
      return simd::load_i8(q + g * q_group_stride + (k % GroupSize)) * simd::splat(scale(g));
    }
    void halves(int32_t k, v8f& lo, v8f& hi) const {
      const int32_t g = k / GroupSize;
      const int8_t* p = q + g * q_group_stride + (k % GroupSize);
      const v8f sv = simd::splat8(scale(g));
      lo = simd::load8_i8(p) * sv;
      hi = simd::load8_i8(p + 8) * sv;
    }
    void prefetch(int32_t k, int64_t ahead) const {
      __builtin_prefetch(q + (k / GroupSize) * q_group_stride + ahead);
    }
    void load(int32_t k, v16f* out) const {
      const int32_t g = k / GroupSize;
      const int8_t* qg = q + g * q_group_stride;
      const v16f sv = simd::splat(scale(g));
      for (int c = 0; c < GroupSize / lanes; ++c) out[c] = simd::load_i8(qg + c * lanes) * sv;
    }
  };
  int64_t row_bytes() const { return w.q_row_stride; }
  cursor row(int32_t r) const {
    return {w.q + r * w.q_row_stride, w.scale + r * w.s_row_stride, w.q_group_stride, w.s_group_stride};
  }
};

// Any layout, element by element (q8_0 with other group sizes, such as 4).
struct generic_reader {
  static constexpr int step = lanes;
  const matrix_view& w;
  struct cursor {
    const matrix_view* w;
    int32_t r;
    v16f chunk(int32_t k) const {
      alignas(64) float buf[lanes];
      for (int i = 0; i < lanes; ++i) buf[i] = w->at(r, k + i);
      return simd::load(buf);
    }
    void halves(int32_t k, v8f& lo, v8f& hi) const {
      alignas(64) float buf[lanes];
      for (int i = 0; i < lanes; ++i) buf[i] = w->at(r, k + i);
      lo = simd::load8(buf);
      hi = simd::load8(buf + 8);
    }
    void load(int32_t k, v16f* out) const { out[0] = chunk(k); }
  };
  cursor row(int32_t r) const { return {&w, r}; }
};

// Rows of a dequantized panel, interleaved by row tile: chunk k/16 of the four rows of a
// tile lie next to each other ([tile][k / 16][row in tile][16] floats), so a register
// tile reads one contiguous stream. Zero beyond cols.
struct panel_reader {
  static constexpr int step = lanes;
  float* panel;
  int64_t padded;  // columns rounded up to 16
  struct cursor {
    const float* p;
    v16f chunk(int32_t k) const { return simd::load(p + int64_t{k} * tile_rows); }
    void halves(int32_t k, v8f& lo, v8f& hi) const {
      lo = simd::load8(p + int64_t{k} * tile_rows);
      hi = simd::load8(p + int64_t{k} * tile_rows + 8);
    }
    void load(int32_t k, v16f* out) const { out[0] = chunk(k); }
  };
  float* at(int32_t r, int32_t k) const {
    return panel + (r / tile_rows) * tile_rows * padded + int64_t{k} * tile_rows + (r % tile_rows) * lanes;
  }
  cursor row(int32_t r) const { return {at(r, 0)}; }
};

// y[i][j] = dot(x[i], W[rows[j]]) for i < MR tokens and j < num_valid rows.
template <int MR, class Reader, bool PaddedReader>
inline void tile(const Reader& rd, const matrix_view& w, const int32_t* rows, int num_valid,
                 const float* x, int64_t x_stride, float* y, int64_t y_stride) {
  v16f acc[MR][tile_rows];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < tile_rows; ++j) acc[i][j] = simd::zero();
  const int32_t cols = w.cols;
  typename Reader::cursor cur[tile_rows];
  for (int j = 0; j < tile_rows; ++j) cur[j] = rd.row(rows[j]);
  // Decode streams every weight once: fetch the rows of the tile after next while this
  // one computes (the hardware prefetcher alone leaves most of the bandwidth unused).
  int64_t ahead = 0;
  if constexpr (requires { rd.row_bytes(); }) ahead = prefetch_rows * rd.row_bytes();
  // Reader::step columns at a time (a whole quantization group), in column order; the
  // lanes see the same sequence of products as a chunk-by-chunk loop.
  constexpr int chunks = Reader::step / lanes;
  int32_t k = 0;
  for (; k + Reader::step <= cols; k += Reader::step) {
    v16f wv[tile_rows][chunks];
    for (int j = 0; j < tile_rows; ++j) {
      if constexpr (requires { rd.row_bytes(); }) cur[j].prefetch(k, ahead);
      cur[j].load(k, wv[j]);
    }
    // One token's input at a time: MR * tile_rows accumulators, tile_rows * chunks weights
    // and one input vector fit the 32 registers without reloads.
    for (int c = 0; c < chunks; ++c)
      for (int i = 0; i < MR; ++i) {
        const v16f xv = simd::load(x + i * x_stride + k + c * lanes);
        for (int j = 0; j < tile_rows; ++j) acc[i][j] = simd::fma(xv, wv[j][c], acc[i][j]);
      }
  }
  for (; k + lanes <= cols; k += lanes) {
    v16f xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = simd::load(x + i * x_stride + k);
    for (int j = 0; j < tile_rows; ++j) {
      const v16f wv = cur[j].chunk(k);
      for (int i = 0; i < MR; ++i) acc[i][j] = simd::fma(xv[i], wv, acc[i][j]);
    }
  }
  if (k < cols) {
    alignas(64) float buf[lanes];
    v16f xv[MR];
    for (int i = 0; i < MR; ++i) {
      for (int l = 0; l < lanes; ++l) buf[l] = k + l < cols ? x[i * x_stride + k + l] : 0.0f;
      xv[i] = simd::load(buf);
    }
    for (int j = 0; j < tile_rows; ++j) {
      v16f wv;
      if constexpr (PaddedReader) {
        wv = cur[j].chunk(k);
      } else {
        tail_generic(w, rows[j], k, buf);
        wv = simd::load(buf);
      }
      for (int i = 0; i < MR; ++i) acc[i][j] = simd::fma(xv[i], wv, acc[i][j]);
    }
  }
  static_assert(tile_rows == 4);
  for (int i = 0; i < MR; ++i) {
    if (num_valid == tile_rows) {
      simd::reduce_add4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], y + i * y_stride);
    } else {
      for (int j = 0; j < num_valid; ++j) y[i * y_stride + j] = simd::reduce_add(acc[i][j]);
    }
  }
}

// tile() for ISAs with sixteen vector registers (AVX2), where a v16f is two registers,
// tile() spills, and GCC moves sixteen-lane values through memory: each v16f accumulator
// is kept as its two eight-lane halves, and every chunk of sixteen columns is loaded just
// before its FMAs, so a tile holds 2 * MR * RT accumulators, one weight half and one input
// half (MR = 1 with RT = 4 rows, or MR = 2 with RT = 2). Each lane sees the same products
// in the same column order as in tile(), and the lanes are summed by the same tree: the
// same bits.
template <int MR, int RT, class Reader, bool PaddedReader>
inline void tile_narrow(const Reader& rd, const matrix_view& w, const int32_t* rows, int num_valid,
                        const float* x, int64_t x_stride, float* y, int64_t y_stride) {
  v8f lo[MR][RT], hi[MR][RT];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < RT; ++j) lo[i][j] = hi[i][j] = v8f{};
  const int32_t cols = w.cols;
  typename Reader::cursor cur[RT];
  for (int j = 0; j < RT; ++j) cur[j] = rd.row(rows[j]);
  int64_t ahead = 0;
  if constexpr (requires { rd.row_bytes(); }) ahead = prefetch_rows * rd.row_bytes();
  int32_t k = 0;
  for (; k + lanes <= cols; k += lanes) {
    for (int j = 0; j < RT; ++j) {
      if constexpr (requires { rd.row_bytes(); })
        if (k % Reader::step == 0) cur[j].prefetch(k, ahead);
      v8f wl, wh;
      cur[j].halves(k, wl, wh);
      for (int i = 0; i < MR; ++i) {
        lo[i][j] = simd::fma8(simd::load8(x + i * x_stride + k), wl, lo[i][j]);
        hi[i][j] = simd::fma8(simd::load8(x + i * x_stride + k + 8), wh, hi[i][j]);
      }
    }
  }
  if (k < cols) {
    alignas(64) float wbuf[lanes], xbuf[lanes];
    for (int j = 0; j < RT; ++j) {
      v8f wl, wh;
      if constexpr (PaddedReader) {
        cur[j].halves(k, wl, wh);
      } else {
        tail_generic(w, rows[j], k, wbuf);
        wl = simd::load8(wbuf);
        wh = simd::load8(wbuf + 8);
      }
      for (int i = 0; i < MR; ++i) {
        for (int l = 0; l < lanes; ++l) xbuf[l] = k + l < cols ? x[i * x_stride + k + l] : 0.0f;
        lo[i][j] = simd::fma8(simd::load8(xbuf), wl, lo[i][j]);
        hi[i][j] = simd::fma8(simd::load8(xbuf + 8), wh, hi[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < std::min(num_valid, RT); ++j) y[i * y_stride + j] = simd::reduce_add(lo[i][j], hi[i][j]);
}

// tokens_loop for sixteen registers: four tokens at a time against each row of the tile
// (one conversion of the weights serves four tokens), then what is left: three against
// each row, two against each half of the tile, or one against the whole tile.
template <class Reader, bool Padded>
void tokens_loop_narrow(const Reader& rd, const matrix_view& w, const int32_t* rows, int num_valid,
                        const float* x, int64_t x_stride, int32_t num_tokens, float* y, int64_t y_stride) {
  static_assert(tile_rows == 4);
  auto by_rows = [&]<int MR, int RT>(int32_t m) {
    for (int j = 0; j < num_valid; j += RT)
      tile_narrow<MR, RT, Reader, Padded>(rd, w, rows + j, std::min(num_valid - j, RT), x + m * x_stride, x_stride,
                                          y + m * y_stride + j, y_stride);
  };
  int32_t m = 0;
  for (; m + 4 <= num_tokens; m += 4) by_rows.template operator()<4, 1>(m);
  switch (num_tokens - m) {
    case 3: by_rows.template operator()<3, 1>(m); break;
    case 2: by_rows.template operator()<2, 2>(m); break;
    case 1: by_rows.template operator()<1, 4>(m); break;
    default: break;
  }
}

#if defined(__AVX512F__)
constexpr bool narrow_registers = false;  // 32 vector registers: tile() fits
#else
constexpr bool narrow_registers = true;
#endif

// Token tiles of MT (register budget: MT * tile_rows accumulators plus the weights of
// one step), then one tile for the rest.
template <int MT, class Reader, bool Padded>
void tokens_loop(const Reader& rd, const matrix_view& w, const int32_t* rows, int num_valid,
                 const float* x, int64_t x_stride, int32_t num_tokens, float* y,
                 int64_t y_stride) {
  int32_t m = 0;
  for (; m + MT <= num_tokens; m += MT)
    tile<MT, Reader, Padded>(rd, w, rows, num_valid, x + m * x_stride, x_stride, y + m * y_stride,
                             y_stride);
  const float* xm = x + m * x_stride;
  float* ym = y + m * y_stride;
  switch (num_tokens - m) {
    case 1: tile<1, Reader, Padded>(rd, w, rows, num_valid, xm, x_stride, ym, y_stride); break;
    case 2: tile<2, Reader, Padded>(rd, w, rows, num_valid, xm, x_stride, ym, y_stride); break;
    case 3: tile<3, Reader, Padded>(rd, w, rows, num_valid, xm, x_stride, ym, y_stride); break;
    case 4:
      if constexpr (MT > 4) tile<4, Reader, Padded>(rd, w, rows, num_valid, xm, x_stride, ym, y_stride);
      break;
    case 5:
      if constexpr (MT > 5) tile<5, Reader, Padded>(rd, w, rows, num_valid, xm, x_stride, ym, y_stride);
      break;
    default: break;
  }
}

template <class Reader>
void rows_direct(const matrix_view& w, int32_t row_begin, int32_t row_end, const float* x,
                 int64_t x_stride, int32_t num_tokens, float* y, int64_t y_stride) {
  const Reader rd{w};
  for (int32_t r0 = row_begin; r0 < row_end; r0 += tile_rows) {
    const int num_valid = std::min<int32_t>(tile_rows, row_end - r0);
    int32_t rows[tile_rows];
    for (int j = 0; j < tile_rows; ++j) rows[j] = r0 + std::min(j, num_valid - 1);
    // A reader of one vector per step leaves registers for six tokens' accumulators (24 +
    // 4 weights + 1 input); a whole Q8_0 group per step, for four.
    constexpr int mt = Reader::step == lanes ? 6 : tile_tokens;
    if constexpr (narrow_registers)
      tokens_loop_narrow<Reader, false>(rd, w, rows, num_valid, x, x_stride, num_tokens, y + r0, y_stride);
    else
      tokens_loop<mt, Reader, false>(rd, w, rows, num_valid, x, x_stride, num_tokens, y + r0, y_stride);
  }
}

// Many tokens: dequantizes a block of rows into a panel that stays in L2, then runs each
// token tile (which stays in L1) against every row tile of the block. Each weight is
// dequantized once per step and each input row is read from L2 once per block.
template <class Reader>
void rows_paneled(const matrix_view& w, int32_t row_begin, int32_t row_end, const float* x,
                  int64_t x_stride, int32_t num_tokens, float* y, int64_t y_stride) {
  const Reader rd{w};
  const int64_t padded = (int64_t{w.cols} + lanes - 1) / lanes * lanes;
  // About 128 KiB of panel (in L2), in whole row tiles.
  const int32_t block_rows =
      static_cast<int32_t>(std::max<int64_t>(tile_rows, (128 * 1024 / 4 / padded) / tile_rows * tile_rows));
  thread_local aligned_vector<float> panel;
  if (static_cast<int64_t>(panel.size()) < block_rows * padded) panel.resize(block_rows * padded);
  int64_t ahead = 0;
  if constexpr (requires { rd.row_bytes(); }) ahead = prefetch_rows * rd.row_bytes();
  for (int32_t b0 = row_begin; b0 < row_end; b0 += block_rows) {
    const int32_t b1 = std::min(row_end, b0 + block_rows);
    const panel_reader pr{panel.data(), padded};
    for (int32_t r = b0; r < b1; ++r) {
      int32_t k = 0;
      const auto cur = rd.row(r);
      if constexpr (narrow_registers)
        for (; k + lanes <= w.cols; k += lanes) {
          if constexpr (requires { rd.row_bytes(); })
            if (k % Reader::step == 0) cur.prefetch(k, ahead);
          v8f lo, hi;
          cur.halves(k, lo, hi);
          std::memcpy(pr.at(r - b0, k), &lo, sizeof lo);
          std::memcpy(pr.at(r - b0, k) + 8, &hi, sizeof hi);
        }
      for (; k + Reader::step <= w.cols; k += Reader::step) {
        if constexpr (requires { rd.row_bytes(); }) cur.prefetch(k, ahead);
        v16f chunk[Reader::step / lanes];
        cur.load(k, chunk);
        for (int c = 0; c < Reader::step / lanes; ++c) simd::store(pr.at(r - b0, k + c * lanes), chunk[c]);
      }
      for (; k + lanes <= w.cols; k += lanes) simd::store(pr.at(r - b0, k), cur.chunk(k));
      if (k < w.cols) {
        alignas(64) float buf[lanes];
        tail_generic(w, r, k, buf);
        simd::store(pr.at(r - b0, k), simd::load(buf));
      }
    }
    for (int32_t m = 0; m < num_tokens; m += panel_tokens) {
      const int32_t mt = std::min(panel_tokens, num_tokens - m);
      for (int32_t r0 = b0; r0 < b1; r0 += tile_rows) {
        const int num_valid = std::min<int32_t>(tile_rows, b1 - r0);
        int32_t rows[tile_rows];
        for (int j = 0; j < tile_rows; ++j) rows[j] = r0 - b0 + std::min(j, num_valid - 1);
        if constexpr (narrow_registers)
          tokens_loop_narrow<panel_reader, true>(pr, w, rows, num_valid, x + m * x_stride, x_stride, mt,
                                                 y + m * y_stride + r0, y_stride);
        else
          tokens_loop<panel_tokens, panel_reader, true>(pr, w, rows, num_valid, x + m * x_stride,
                                                        x_stride, mt, y + m * y_stride + r0, y_stride);
      }
    }
  }
}

template <class Reader>
void rows_any(const matrix_view& w, int32_t b, int32_t e, const float* x, int64_t xs,
              int32_t m, float* y, int64_t ys) {
  // (With sixteen registers, eight tokens are two passes of four over the weights, which
  // still costs less than dequantizing a panel.)
  if (m <= (narrow_registers ? 2 * tile_tokens : tile_tokens))
    rows_direct<Reader>(w, b, e, x, xs, m, y, ys);
  else
    rows_paneled<Reader>(w, b, e, x, xs, m, y, ys);
}

}  // namespace

namespace {

void rows_of(const matrix_view& w, int32_t rb, int32_t re, const float* x, int64_t x_stride,
             int32_t num_tokens, float* y, int64_t y_stride) {
  switch (w.type) {
    case dtype::f32:
      // F32 rows need no dequantizing: straight from memory, unless the step is long
      // enough that a panel in L2 pays for its copy.
      if (num_tokens < 48)
        rows_direct<f32_reader>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
      else
        rows_paneled<f32_reader>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
      break;
    case dtype::f16:
      rows_any<f16_reader>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
      break;
    case dtype::bf16:
      rows_any<bf16_reader>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
      break;
    case dtype::q8_0:
      if (w.group_size == 32 && w.scale_is_f16)
        rows_any<q8_reader<32, true>>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
      else if (w.group_size == 32)
        rows_any<q8_reader<32, false>>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
      else if (w.group_size == 64 && !w.scale_is_f16)
        rows_any<q8_reader<64, false>>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
      else
        rows_any<generic_reader>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
      break;
  }
}

// Rows per task: whole 16-row blocks of packed weights, and enough of them that each
// task streams a long run of weights and the hand-out costs nothing beside it.
constexpr int64_t row_chunk = 128;
static_assert(row_chunk % (tile_rows * 4) == 0);

}  // namespace

void gemm(const float* x, int64_t x_stride, int32_t num_tokens, const matrix_view& w, float* y,
          int64_t y_stride, thread_pool& pool) {
  const gemm_output out{&w, y, y_stride};
  gemm_multi(x, x_stride, num_tokens, &out, 1, pool);
}

void gemm_multi(const float* x, int64_t x_stride, int32_t num_tokens, const gemm_output* outs,
                int num_outs, thread_pool& pool) {
  if (num_tokens <= 0) return;
  int64_t total = 0;
  for (int i = 0; i < num_outs; ++i) total += outs[i].w->rows;
  // Packed q8_0 weights take int8 activations, quantized once for every output.
  thread_local q8_activations quantized;
  const q8_activations* acts = nullptr;
  for (int i = 0; i < num_outs && !acts; ++i)
    if (const q8_packed* p = outs[i].w->packed) {
      quantized.quantize(x, x_stride, num_tokens, p->cols, p->group, &pool);
      acts = &quantized;
    }
  const w8a8_kernel kernel = w8a8_kernel_in_use().value_or(w8a8_kernel::scalar);
  // Rows of all outputs, one after another, in chunks, each thread running through a
  // stripe of them (every kernel gives a row the same bits whoever computes it).
  pool.parallel_for_stripes(total, row_chunk, [&](int64_t b, int64_t e, int64_t stripe_end, int) {
    int64_t first = 0;
    for (int i = 0; i < num_outs && first < e; ++i) {
      const matrix_view& w = *outs[i].w;
      const int64_t lo = std::max(b, first), hi = std::min(e, first + w.rows);
      if (lo < hi) {
        const auto rb = static_cast<int32_t>(lo - first), re = static_cast<int32_t>(hi - first);
        const auto fetch_end = static_cast<int32_t>(std::min(stripe_end, first + w.rows) - first);
        if (w.packed)
          gemm_w8a8_rows(*acts, *w.packed, rb, re, outs[i].y, outs[i].y_stride, kernel, fetch_end);
        else
          rows_of(w, rb, re, x, x_stride, num_tokens, outs[i].y, outs[i].y_stride);
      }
      first += w.rows;
    }
  });
}

}  // namespace troupe
