#include "kernels/cpu/gemm.hpp"

#include <algorithm>
#include <vector>

#include "kernels/cpu/simd.hpp"

namespace troupe {

namespace {

using simd::v16f;
constexpr int lanes = simd::width;
constexpr int tile_rows = 4;    // weight rows per register tile
constexpr int tile_tokens = 4;  // tokens per register tile

// Readers return sixteen dequantized weights of one row. chunk(r, k) requires
// k + 16 <= cols; tail(r, k, out) fills out with the columns from k to the end of the
// row, zero-padded, computing each value exactly as chunk() would.
void tail_generic(const matrix_view& w, int32_t r, int32_t k, float* out) {
  for (int i = 0; i < lanes; ++i) out[i] = k + i < w.cols ? w.at(r, k + i) : 0.0f;
}

struct f32_reader {
  const matrix_view& w;
  v16f chunk(int32_t r, int32_t k) const {
    return simd::load(static_cast<const float*>(w.data) + r * w.row_stride + k);
  }
};

struct f16_reader {
  const matrix_view& w;
  v16f chunk(int32_t r, int32_t k) const {
    return simd::load_f16(static_cast<const uint16_t*>(w.data) + r * w.row_stride + k);
  }
};

struct bf16_reader {
  const matrix_view& w;
  v16f chunk(int32_t r, int32_t k) const {
    return simd::load_bf16(static_cast<const uint16_t*>(w.data) + r * w.row_stride + k);
  }
};

// q8_0 with a group size that is a multiple of 16: a chunk lies inside one group.
struct q8_reader {
  const matrix_view& w;
  v16f chunk(int32_t r, int32_t k) const {
    const int32_t g = k / w.group_size;
    const int8_t* q = w.q + r * w.q_row_stride + g * w.q_group_stride + (k - g * w.group_size);
    return simd::load_i8(q) * simd::splat(w.scale_at(r, g));
  }
};

// Any layout, element by element (q8_0 with small groups, such as 4).
struct generic_reader {
  const matrix_view& w;
  v16f chunk(int32_t r, int32_t k) const {
    alignas(64) float buf[lanes];
    for (int i = 0; i < lanes; ++i) buf[i] = w.at(r, k + i);
    return simd::load(buf);
  }
};

// Rows of a dequantized panel: [tile_rows][padded_cols] floats, zero beyond cols.
struct panel_reader {
  const float* panel;
  int64_t stride;
  v16f chunk(int32_t r, int32_t k) const { return simd::load(panel + r * stride + k); }
};

// y[i][j] = dot(x[i], W[rows[j]]) for i < MR tokens and j < num_valid rows.
template <int MR, class Reader, bool PaddedReader>
inline void tile(const Reader& rd, const matrix_view& w, const int32_t* rows, int num_valid,
                 const float* x, int64_t x_stride, float* y, int64_t y_stride) {
  v16f acc[MR][tile_rows];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < tile_rows; ++j) acc[i][j] = simd::zero();
  const int32_t cols = w.cols;
  int32_t k = 0;
  for (; k + lanes <= cols; k += lanes) {
    v16f xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = simd::load(x + i * x_stride + k);
    for (int j = 0; j < tile_rows; ++j) {
      const v16f wv = rd.chunk(rows[j], k);
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
        wv = rd.chunk(rows[j], k);
      } else {
        tail_generic(w, rows[j], k, buf);
        wv = simd::load(buf);
      }
      for (int i = 0; i < MR; ++i) acc[i][j] = simd::fma(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < num_valid; ++j) y[i * y_stride + j] = simd::reduce_add(acc[i][j]);
}

template <class Reader, bool Padded>
void tokens_loop(const Reader& rd, const matrix_view& w, const int32_t* rows, int num_valid,
                 const float* x, int64_t x_stride, int32_t num_tokens, float* y,
                 int64_t y_stride) {
  int32_t m = 0;
  for (; m + tile_tokens <= num_tokens; m += tile_tokens)
    tile<tile_tokens, Reader, Padded>(rd, w, rows, num_valid, x + m * x_stride, x_stride,
                                      y + m * y_stride, y_stride);
  const float* xm = x + m * x_stride;
  float* ym = y + m * y_stride;
  switch (num_tokens - m) {
    case 1: tile<1, Reader, Padded>(rd, w, rows, num_valid, xm, x_stride, ym, y_stride); break;
    case 2: tile<2, Reader, Padded>(rd, w, rows, num_valid, xm, x_stride, ym, y_stride); break;
    case 3: tile<3, Reader, Padded>(rd, w, rows, num_valid, xm, x_stride, ym, y_stride); break;
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
    tokens_loop<Reader, false>(rd, w, rows, num_valid, x, x_stride, num_tokens, y + r0,
                               y_stride);
  }
}

// Dequantizes tile_rows rows once, then runs every token tile against the panel.
template <class Reader>
void rows_paneled(const matrix_view& w, int32_t row_begin, int32_t row_end, const float* x,
                  int64_t x_stride, int32_t num_tokens, float* y, int64_t y_stride) {
  const Reader rd{w};
  const int64_t padded = (int64_t{w.cols} + lanes - 1) / lanes * lanes;
  thread_local std::vector<float> panel;
  if (static_cast<int64_t>(panel.size()) < tile_rows * padded) panel.resize(tile_rows * padded);
  const panel_reader pr{panel.data(), padded};
  const int32_t panel_rows[tile_rows] = {0, 1, 2, 3};
  for (int32_t r0 = row_begin; r0 < row_end; r0 += tile_rows) {
    const int num_valid = std::min<int32_t>(tile_rows, row_end - r0);
    for (int j = 0; j < tile_rows; ++j) {
      const int32_t r = r0 + std::min(j, num_valid - 1);
      float* dst = panel.data() + j * padded;
      int32_t k = 0;
      for (; k + lanes <= w.cols; k += lanes) simd::store(dst + k, rd.chunk(r, k));
      if (k < w.cols) tail_generic(w, r, k, dst + k);
    }
    tokens_loop<panel_reader, true>(pr, w, panel_rows, num_valid, x, x_stride, num_tokens,
                                    y + r0, y_stride);
  }
}

template <class Reader>
void rows_any(const matrix_view& w, int32_t b, int32_t e, const float* x, int64_t xs,
              int32_t m, float* y, int64_t ys) {
  if (m <= tile_tokens)
    rows_direct<Reader>(w, b, e, x, xs, m, y, ys);
  else
    rows_paneled<Reader>(w, b, e, x, xs, m, y, ys);
}

}  // namespace

void gemm(const float* x, int64_t x_stride, int32_t num_tokens, const matrix_view& w, float* y,
          int64_t y_stride, thread_pool& pool) {
  if (num_tokens <= 0 || w.rows <= 0) return;
  // Enough rows per task that each thread streams long runs of weights.
  const int64_t grain = tile_rows * 4;
  pool.parallel_for(w.rows, grain, [&](int64_t b, int64_t e, int) {
    const auto rb = static_cast<int32_t>(b), re = static_cast<int32_t>(e);
    switch (w.type) {
      case dtype::f32:
        rows_direct<f32_reader>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
        break;
      case dtype::f16:
        rows_any<f16_reader>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
        break;
      case dtype::bf16:
        rows_any<bf16_reader>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
        break;
      case dtype::q8_0:
        if (w.group_size % lanes == 0)
          rows_any<q8_reader>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
        else
          rows_any<generic_reader>(w, rb, re, x, x_stride, num_tokens, y, y_stride);
        break;
    }
  });
}

}  // namespace troupe
