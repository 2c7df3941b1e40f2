#include "kernels/cpu/gemm.hpp"

#include "kernels/cpu/gemm_w8a8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <doctest/doctest.h>

#include "engine/sample/rng.hpp"
#include "tests/support/random_data.hpp"
#include "tests/support/tolerance.hpp"

namespace troupe {
namespace {

// A weight matrix in one of the stored layouts, built from random floats, and the values
// its bytes stand for, decoded here from what the test stored (not through matrix_view,
// whose accessors share their decoding with the kernels).
struct test_matrix {
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> scales;
  matrix_view view;
  std::vector<double> values;  // [rows][cols]
};

// IEEE half to double, bit by bit: sign, 5-bit exponent (bias 15), 10-bit fraction.
double half_value(uint16_t h) {
  const int exponent = (h >> 10) & 31, fraction = h & 1023;
  const double magnitude = exponent == 0 ? std::ldexp(fraction, -24) : std::ldexp(1024 + fraction, exponent - 25);
  REQUIRE(exponent != 31);  // the test stores no infinity or NaN
  return (h & 0x8000) ? -magnitude : magnitude;
}

// bfloat16 to double: the upper half of a float's bits.
double bf16_value(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

enum class layout { f32, f16, bf16, q8_gguf, q8_llama2c_gs64, q8_llama2c_gs4 };

test_matrix make_matrix(layout l, int32_t rows, int32_t cols, uint64_t seed) {
  const auto vals = test::random_floats(size_t(rows) * cols, seed);
  test_matrix t;
  switch (l) {
    case layout::f32:
      t.bytes.resize(vals.size() * 4);
      std::memcpy(t.bytes.data(), vals.data(), t.bytes.size());
      t.view = matrix_view::dense(dtype::f32, t.bytes.data(), rows, cols);
      t.values.assign(vals.begin(), vals.end());
      break;
    case layout::f16:
    case layout::bf16: {
      t.bytes.resize(vals.size() * 2);
      auto* h = reinterpret_cast<uint16_t*>(t.bytes.data());
      for (size_t i = 0; i < vals.size(); ++i) h[i] = l == layout::f16 ? f32_to_f16(vals[i]) : f32_to_bf16(vals[i]);
      t.view = matrix_view::dense(l == layout::f16 ? dtype::f16 : dtype::bf16, t.bytes.data(), rows, cols);
      for (size_t i = 0; i < vals.size(); ++i) t.values.push_back(l == layout::f16 ? half_value(h[i]) : bf16_value(h[i]));
      break;
    }
    case layout::q8_gguf: {
      const int32_t groups = cols / 32;
      t.bytes.resize(size_t(rows) * groups * 34);
      t.values.resize(vals.size());
      for (int32_t r = 0; r < rows; ++r)
        for (int32_t g = 0; g < groups; ++g) {
          uint8_t* b = t.bytes.data() + (size_t(r) * groups + g) * 34;
          const uint16_t d = f32_to_f16(0.01f + 0.001f * ((r + g) % 7));
          std::memcpy(b, &d, 2);
          for (int i = 0; i < 32; ++i) {
            const auto q = static_cast<int8_t>(std::lround(vals[size_t(r) * cols + g * 32 + i] * 127));
            b[2 + i] = static_cast<uint8_t>(q);
            t.values[size_t(r) * cols + g * 32 + i] = q * half_value(d);
          }
        }
      matrix_view& v = t.view;
      v.type = dtype::q8_0;
      v.rows = rows;
      v.cols = cols;
      v.group_size = 32;
      v.q = reinterpret_cast<const int8_t*>(t.bytes.data() + 2);
      v.q_row_stride = int64_t{groups} * 34;
      v.q_group_stride = 34;
      v.scale = t.bytes.data();
      v.s_row_stride = v.q_row_stride;
      v.s_group_stride = 34;
      v.scale_is_f16 = true;
      break;
    }
    case layout::q8_llama2c_gs64:
    case layout::q8_llama2c_gs4: {
      const int32_t gs = l == layout::q8_llama2c_gs64 ? 64 : 4;
      t.bytes.resize(vals.size());
      for (size_t i = 0; i < vals.size(); ++i) t.bytes[i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(vals[i] * 127)));
      std::vector<float> s(vals.size() / gs);
      for (size_t i = 0; i < s.size(); ++i) s[i] = 0.02f + 0.003f * (i % 5);
      for (size_t i = 0; i < vals.size(); ++i) t.values.push_back(static_cast<int8_t>(t.bytes[i]) * double(s[i / gs]));
      t.scales.resize(s.size() * 4);
      std::memcpy(t.scales.data(), s.data(), t.scales.size());
      matrix_view& v = t.view;
      v.type = dtype::q8_0;
      v.rows = rows;
      v.cols = cols;
      v.group_size = gs;
      v.q = reinterpret_cast<const int8_t*>(t.bytes.data());
      v.q_row_stride = cols;
      v.q_group_stride = gs;
      v.scale = t.scales.data();
      v.s_row_stride = int64_t{cols / gs} * 4;
      v.s_group_stride = 4;
      break;
    }
  }
  return t;
}

// y = x W^T in double, from the test's own values of the weights.
std::vector<double> reference(const std::vector<float>& x, int32_t m, const test_matrix& w) {
  const int32_t rows = w.view.rows, cols = w.view.cols;
  std::vector<double> y(size_t(m) * rows);
  for (int32_t i = 0; i < m; ++i)
    for (int32_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int32_t c = 0; c < cols; ++c) s += double(x[size_t(i) * cols + c]) * w.values[size_t(r) * cols + c];
      y[size_t(i) * rows + r] = s;
    }
  return y;
}

const float poison = std::numeric_limits<float>::quiet_NaN();

// The int8 activations' definition for one group: scale = max |x| / 127, q = x / scale
// rounded to nearest even (0 where the scale is 0).
float quantized_scale(const float* xg, int32_t group) {
  float amax = 0.0f;
  for (int32_t k = 0; k < group; ++k) amax = std::max(amax, std::fabs(xg[k]));
  return amax / 127.0f;
}
int8_t quantized_value(float x, float scale) {
  return static_cast<int8_t>(scale > 0.0f ? std::clamp(std::nearbyint(x / scale), -127.0f, 127.0f) : 0.0f);
}

// x as the int8 kernels multiply it, by the definition: quantized per token and group.
std::vector<float> as_quantized(const std::vector<float>& x, int32_t m, int32_t cols, int32_t group) {
  std::vector<float> out(x.size());
  for (int32_t t = 0; t < m; ++t)
    for (int32_t g = 0; g < cols / group; ++g) {
      const float* xg = x.data() + size_t(t) * cols + g * group;
      const float scale = quantized_scale(xg, group);
      for (int32_t k = 0; k < group; ++k) out[size_t(t) * cols + g * group + k] = float(quantized_value(xg[k], scale)) * scale;
    }
  return out;
}

void check_layout(layout l, std::initializer_list<int32_t> col_sizes, bool packed_too = false) {
  thread_pool pool(3);
  uint64_t seed = 1;
  for (int32_t cols : col_sizes)
    for (int32_t rows : {1, 3, 4, 5, 17, 33})
      for (int32_t m : {1, 2, 3, 4, 5, 7, 9}) {
        CAPTURE(cols);
        CAPTURE(rows);
        CAPTURE(m);
        const test_matrix t = make_matrix(l, rows, cols, seed++);
        const auto x = test::random_floats(size_t(m) * cols, seed++);
        // Packed q8_0 weights (int8 activations, on CPUs with VNNI) must match the exact
        // product of the quantized activations; everything else the product of x.
        q8_packed packed;
        matrix_view w = t.view;
        if (packed_too && w8a8_layout(w) && vnni_available()) {
          packed = pack_q8(w);
          w.packed = &packed;
        }
        // Output rows are wider than the matrix: the extra columns must stay poisoned.
        const int32_t ys = rows + 3;
        std::vector<float> y(size_t(m) * ys, poison);
        gemm(x.data(), cols, m, w, y.data(), ys, pool);
        const auto ref = reference(w.packed ? as_quantized(x, m, cols, w.group_size) : x, m, t);
        for (int32_t i = 0; i < m; ++i) {
          double norm = 0;
          for (int32_t c = 0; c < cols; ++c) norm += std::fabs(x[size_t(i) * cols + c]);
          for (int32_t r = 0; r < rows; ++r) {
            const double want = ref[size_t(i) * rows + r];
            const float got = y[size_t(i) * ys + r];
            REQUIRE(std::isfinite(got));
            // Float accumulation over cols terms: error bounded relative to sum |x_k w_k|.
            CHECK(std::fabs(got - want) <= 1e-5 * norm + 1e-6);
          }
          for (int32_t r = rows; r < ys; ++r) CHECK(std::isnan(y[size_t(i) * ys + r]));
        }
      }
}

}  // namespace

TEST_CASE("gemm f32 matches a double-precision reference, odd sizes included") {
  check_layout(layout::f32, {16, 21, 64, 100});
}
TEST_CASE("gemm f16 matches a double-precision reference") { check_layout(layout::f16, {16, 37, 96}); }
TEST_CASE("gemm bf16 matches a double-precision reference") { check_layout(layout::bf16, {16, 50, 128}); }
TEST_CASE("gemm q8_0 in GGUF blocks matches a double-precision reference") { check_layout(layout::q8_gguf, {32, 96, 160}); }
TEST_CASE("gemm q8_0 in llama2.c layout, group 64") { check_layout(layout::q8_llama2c_gs64, {64, 192}); }
TEST_CASE("gemm q8_0 in llama2.c layout, group 4 (element path)") { check_layout(layout::q8_llama2c_gs4, {4, 20, 172}); }

TEST_CASE("gemm results do not depend on batch size or thread count") {
  // 13 tokens: register tiles and a remainder; 50: the panel path of every type.
  for (int32_t m : {13, 50})
  for (layout l : {layout::f32, layout::f16, layout::bf16, layout::q8_gguf, layout::q8_llama2c_gs4}) {
    CAPTURE(static_cast<int>(l));
    CAPTURE(m);
    const int32_t rows = 37, cols = l == layout::f32 || l == layout::bf16 ? 100 : 96;  // 100: a ragged tail
    const test_matrix t = make_matrix(l, rows, cols, 77);
    const auto x = test::random_floats(size_t(m) * cols, 78);
    thread_pool one(1), three(3);
    std::vector<float> batched(size_t(m) * rows), alone(size_t(m) * rows), threaded(size_t(m) * rows);
    gemm(x.data(), cols, m, t.view, batched.data(), rows, one);
    gemm(x.data(), cols, m, t.view, threaded.data(), rows, three);
    for (int32_t i = 0; i < m; ++i) gemm(x.data() + size_t(i) * cols, cols, 1, t.view, alone.data() + size_t(i) * rows, rows, one);
    CHECK(test::same_finite_bits(batched, alone));
    CHECK(test::same_finite_bits(batched, threaded));
  }
}

TEST_CASE("gemm on row and column slices equals the slice of the full product") {
  thread_pool pool(2);
  const test_matrix t = make_matrix(layout::q8_gguf, 24, 128, 5);
  const auto x = test::random_floats(128, 6);
  // Columns 32..95 of the input with the matching weight columns, rows 8..15.
  const matrix_view part = t.view.slice_rows(8, 8).slice_cols(32, 64);
  std::vector<float> y(8);
  gemm(x.data() + 32, 64, 1, part, y.data(), 8, pool);
  for (int32_t r = 0; r < 8; ++r) {
    double want = 0;
    for (int32_t c = 32; c < 96; ++c) want += double(x[c]) * t.values[size_t(8 + r) * 128 + c];
    CHECK(y[r] == doctest::Approx(want).epsilon(1e-5));
  }
}

TEST_CASE("w8a8: packed q8_0 weights with int8 activations match the exact product of the quantized input") {
  check_layout(layout::q8_gguf, {32, 96, 160}, true);
  check_layout(layout::q8_llama2c_gs64, {64, 192}, true);
  if (!vnni_available()) MESSAGE("no VNNI on this CPU: gemm() keeps float activations, checked above");
}

TEST_CASE("w8a8: AMX tiles, VNNI and the scalar loop give the same bits, for any batch and row range") {
  for (layout l : {layout::q8_gguf, layout::q8_llama2c_gs64}) {
    const int32_t rows = 45, cols = 192;  // two 16-row blocks and a partial one
    const test_matrix t = make_matrix(l, rows, cols, 11);
    const q8_packed w = pack_q8(t.view);
    // GGUF's F16 scales pack into compact records, llama2.c's float ones into full ones:
    // both kinds are checked.
    CHECK(w.compact == (l == layout::q8_gguf));
    const auto x = test::random_floats(size_t(37) * cols, 12);
    // Every VNNI pass width (1 to 8) alone, and after whole passes over the same blocks.
    for (int32_t m : {1, 3, 4, 5, 6, 7, 8, 9, 14, 16, 17, 21, 37}) {
      CAPTURE(m);
      q8_activations a;
      a.quantize(x.data(), cols, m, cols, w.group);
      std::vector<float> scalar(size_t(m) * rows, poison);
      gemm_w8a8_rows(a, w, 0, rows, scalar.data(), rows, w8a8_kernel::scalar);
      for (w8a8_kernel k : {w8a8_kernel::vnni, w8a8_kernel::amx}) {
        if (k == w8a8_kernel::vnni ? !vnni_available() : !amx_available()) {
          MESSAGE("this CPU lacks the kernel's instructions: not checked here");
          continue;
        }
        std::vector<float> y(size_t(m) * rows, poison);
        gemm_w8a8_rows(a, w, 3, 40, y.data(), rows, k);  // rows inside blocks, on both sides
        gemm_w8a8_rows(a, w, 0, 3, y.data(), rows, k);
        gemm_w8a8_rows(a, w, 40, rows, y.data(), rows, k);
        CHECK(test::same_finite_bits(scalar, y));
      }
      // Batch invariance: token 0 alone gives its row of the batch, bit for bit.
      q8_activations one;
      one.quantize(x.data(), cols, 1, cols, w.group);
      std::vector<float> alone(rows);
      gemm_w8a8_rows(one, w, 0, rows, alone.data(), rows, w8a8_kernel::scalar);
      CHECK(test::same_finite_bits(alone, std::span(scalar).first(rows)));
    }
  }
}

TEST_CASE("w8a8: quantized activations are the definition's bits, values at half-integer quotients included") {
  // The definition: scale = max |x| / 127, q = x / scale rounded to nearest even, and the
  // unsigned copy q + 128. Scales from subnormal to 2^123 (the kernels divide by some and
  // multiply by the reciprocal of others), and group counts below, at and past sixteen.
  struct shape {
    int32_t cols, group;
  };
  for (const shape sh : {shape{256, 32}, shape{544, 32}, shape{1088, 64}}) {
    const int32_t cols = sh.cols, group = sh.group, tokens = 40;
    CAPTURE(cols);
    CAPTURE(group);
    std::vector<float> x = test::random_floats(size_t(tokens) * cols, 41 + cols);
    rng r(42 + cols);
    for (int32_t t = 0; t < tokens; ++t)
      for (int32_t g = 0; g < cols / group; ++g) {
        float* xg = x.data() + size_t(t) * cols + g * group;
        // Scales of every magnitude, and quotients at, next to and halfway between integers.
        const float mag = std::ldexp(1.0f, static_cast<int>(r.next() % 250) - 125);
        for (int32_t k = 0; k < group; ++k) xg[k] *= mag;
        float amax = 0.0f;
        for (int32_t k = 0; k < group; ++k) amax = std::max(amax, std::fabs(xg[k]));
        const float scale = amax / 127.0f;
        for (int32_t k = 1; k < group; k += 3) {
          const float half = static_cast<float>(static_cast<int>(r.next() % 254) - 127) + 0.5f;
          float v = std::min(half * scale, amax);
          for (int step = static_cast<int>(r.next() % 5) - 2; step != 0; step += step > 0 ? -1 : 1)
            v = std::nextafter(v, step > 0 ? INFINITY : -INFINITY);
          xg[k] = std::fabs(v) <= amax ? v : xg[k];
        }
      }
    q8_activations a;
    a.quantize(x.data(), cols, tokens, cols, group);
    int wrong = 0;
    for (int32_t t = 0; t < tokens; ++t)
      for (int32_t g = 0; g < cols / group; ++g) {
        const float* xg = x.data() + size_t(t) * cols + g * group;
        const float scale = quantized_scale(xg, group);
        wrong += a.scale_at(t, g) != scale;
        for (int32_t k = 0; k < group; ++k) {
          const int8_t q = quantized_value(xg[k], scale);
          wrong += a.at(t, g * group + k) != q;
          wrong += a.unsigned_at(t, g * group + k) != static_cast<uint8_t>(q + 128);
        }
      }
    CHECK(wrong == 0);
  }
}

TEST_CASE("w8a8: activations quantized on a pool's threads are the bytes of one thread's quantizing") {
  thread_pool pool(3);
  for (int32_t group : {32, 64})
    for (int32_t cols : {group, 3 * group, 2048})
      for (int32_t tokens : {2, 5, 16, 17, 32, 40, 100}) {
        CAPTURE(group);
        CAPTURE(cols);
        CAPTURE(tokens);
        const int64_t stride = cols + 16;  // rows of a wider buffer
        const auto x = test::random_floats(size_t(tokens) * stride, uint64_t(cols) * 100 + tokens);
        q8_activations alone, shared;
        alone.quantize(x.data(), stride, tokens, cols, group);
        shared.quantize(x.data(), stride, tokens, cols, group, &pool);
        CHECK(alone.q == shared.q);
        CHECK(alone.u == shared.u);
        REQUIRE(alone.scale.size() == shared.scale.size());
        CHECK(test::same_finite_bits(alone.scale, shared.scale));
      }
}

TEST_CASE("w8a8: a group holding a NaN or an infinity quantizes to zeros under a NaN scale, and its token's outputs are NaN") {
  const int32_t cols = 96, group = 32, tokens = 20, rows = 21;
  std::vector<float> x = test::random_floats(size_t(tokens) * cols, 61);
  const float inf = std::numeric_limits<float>::infinity();
  x[size_t(0) * cols + 40] = std::numeric_limits<float>::quiet_NaN();  // token 0, group 1
  x[size_t(1) * cols + 3] = inf;                                       // token 1, group 0
  x[size_t(17) * cols + 95] = -inf;                                    // token 17, group 2
  const auto special = [](int32_t t, int32_t g) { return (t == 0 && g == 1) || (t == 1 && g == 0) || (t == 17 && g == 2); };
  thread_pool pool(2);
  for (thread_pool* p : {static_cast<thread_pool*>(nullptr), &pool}) {
    q8_activations a;
    a.quantize(x.data(), cols, tokens, cols, group, p);
    for (int32_t t = 0; t < tokens; ++t)
      for (int32_t g = 0; g < cols / group; ++g) {
        CAPTURE(t);
        CAPTURE(g);
        CHECK(std::isnan(a.scale_at(t, g)) == special(t, g));
        if (!special(t, g)) continue;
        for (int32_t k = 0; k < group; ++k) {
          CHECK(a.at(t, g * group + k) == 0);
          CHECK(a.unsigned_at(t, g * group + k) == 128);
        }
      }
    const test_matrix m = make_matrix(layout::q8_gguf, rows, cols, 62);
    const q8_packed w = pack_q8(m.view);
    for (w8a8_kernel k : {w8a8_kernel::scalar, w8a8_kernel::vnni, w8a8_kernel::amx}) {
      if (k == w8a8_kernel::vnni ? !vnni_available() : k == w8a8_kernel::amx && !amx_available()) continue;
      std::vector<float> y(size_t(tokens) * rows, 0.0f);
      gemm_w8a8_rows(a, w, 0, rows, y.data(), rows, k);
      for (int32_t t = 0; t < tokens; ++t)
        for (int32_t r = 0; r < rows; ++r) {
          const bool touched = t == 0 || t == 1 || t == 17;
          CHECK(std::isnan(y[size_t(t) * rows + r]) == touched);
        }
    }
  }
}

TEST_CASE("w8a8: activations quantize per token and group, the largest to +-127, zeros to zero") {
  std::vector<float> x(2 * 64, 0.0f);
  for (int k = 0; k < 32; ++k) x[k] = 0.01f * (k - 16);  // token 0, group 0; group 1 all zero
  x[64 + 40] = -3.0f;
  x[64 + 41] = 1.5f;
  q8_activations a;
  a.quantize(x.data(), 64, 2, 64, 32);
  CHECK(a.scale_at(0, 0) == doctest::Approx(0.16f / 127));
  CHECK(a.at(0, 0) == -127);
  CHECK(a.at(0, 16) == 0);
  CHECK(a.scale_at(0, 1) == 0.0f);
  CHECK(a.at(0, 40) == 0);
  CHECK(a.at(1, 40) == -127);
  CHECK(a.at(1, 41) == 64);  // 63.5 rounds to even
  CHECK(a.at(1, 0) == 0);
}

}  // namespace troupe
