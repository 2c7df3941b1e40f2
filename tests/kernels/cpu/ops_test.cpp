// Element-wise and per-vector kernels against plain double-precision references.
#include <cmath>
#include <cstring>
#include <vector>

#include <doctest/doctest.h>

#include "engine/sample/rng.hpp"
#include "kernels/cpu/argmax.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/silu_mul.hpp"
#include "kernels/cpu/softmax.hpp"
#include "tests/support/random_data.hpp"

namespace troupe {

TEST_CASE("rmsnorm matches the definition for odd sizes, in place too") {
  for (int32_t n : {1, 7, 16, 33, 64, 255}) {
    CAPTURE(n);
    const auto x = test::random_floats(n, n);
    const auto w = test::random_floats(n, n + 100, 0.5f, 1.5f);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
    std::vector<float> out(n + 1, -7.0f);
    rmsnorm(out.data(), x.data(), w.data(), n, 1e-5f);
    for (int32_t i = 0; i < n; ++i) CHECK(out[i] == doctest::Approx(w[i] * x[i] * inv).epsilon(1e-5));
    CHECK(out[n] == -7.0f);
    std::vector<float> inplace = x;
    rmsnorm(inplace.data(), inplace.data(), w.data(), n, 1e-5f);
    for (int32_t i = 0; i < n; ++i) CHECK(inplace[i] == out[i]);
  }
}

TEST_CASE("rope rotates pairs and halves by the table's angles") {
  const int32_t heads = 3, head_dim = 10, rot = 8, pos = 5;
  std::vector<float> cos(64 * rot / 2), sin(64 * rot / 2);
  rope_table(cos.data(), sin.data(), 64, rot, 10000.0f);
  for (rope_layout layout : {rope_layout::pairs, rope_layout::halves}) {
    const auto v0 = test::random_floats(heads * head_dim, 9);
    auto v = v0;
    rope(v.data(), heads, head_dim, rot, cos.data() + pos * rot / 2, sin.data() + pos * rot / 2, layout);
    for (int32_t h = 0; h < heads; ++h) {
      for (int32_t i = 0; i < rot / 2; ++i) {
        const double angle = pos * std::pow(10000.0, -2.0 * i / rot);
        const int32_t a = h * head_dim + (layout == rope_layout::pairs ? 2 * i : i);
        const int32_t b = h * head_dim + (layout == rope_layout::pairs ? 2 * i + 1 : i + rot / 2);
        CHECK(v[a] == doctest::Approx(v0[a] * std::cos(angle) - v0[b] * std::sin(angle)).epsilon(1e-4));
        CHECK(v[b] == doctest::Approx(v0[a] * std::sin(angle) + v0[b] * std::cos(angle)).epsilon(1e-4));
      }
      for (int32_t d = rot; d < head_dim; ++d) CHECK(v[h * head_dim + d] == v0[h * head_dim + d]);
    }
  }
}

TEST_CASE("softmax sums to one, is stable for large logits and keeps order") {
  for (int32_t n : {1, 2, 17, 512}) {
    auto x = test::random_floats(n, n, -50.0f, 50.0f);
    x[0] = 1e4f;  // would overflow exp without the max subtraction
    const auto orig = x;
    softmax(x.data(), n);
    double sum = 0;
    for (float p : x) {
      CHECK(std::isfinite(p));
      sum += p;
    }
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
    for (int32_t i = 1; i < n; ++i) {
      const double want = std::exp(double(orig[i]) - 1e4);
      CHECK(x[i] == doctest::Approx(want).epsilon(1e-4));
    }
  }
}

TEST_CASE("silu_mul matches x * sigmoid(x) * up") {
  const int32_t n = 45;
  auto gate = test::random_floats(n, 1, -8.0f, 8.0f);
  const auto up = test::random_floats(n, 2);
  const auto g0 = gate;
  silu_mul(gate.data(), up.data(), n);
  for (int32_t i = 0; i < n; ++i)
    CHECK(gate[i] == doctest::Approx(g0[i] / (1.0 + std::exp(-double(g0[i]))) * up[i]).epsilon(1e-5));
}

TEST_CASE("argmax returns the first maximum") {
  std::vector<float> x{1, 5, 3, 5, -2};
  CHECK(argmax(x.data(), 5) == 1);
  CHECK(argmax(x.data(), 1) == 0);
  x = {-3, -1, -1};
  CHECK(argmax(x.data(), 3) == 1);
}

TEST_CASE("argmax over long rows is the scalar definition: the first maximum, NaN never wins but at 0") {
  auto reference = [](const std::vector<float>& v) {
    int32_t best = 0;
    for (int32_t i = 1; i < static_cast<int32_t>(v.size()); ++i)
      if (v[i] > v[best]) best = i;
    return best;
  };
  rng r(11);
  for (int32_t n : {31, 32, 33, 47, 100, 512, 32000}) {
    for (int trial = 0; trial < 20; ++trial) {
      CAPTURE(n);
      CAPTURE(trial);
      std::vector<float> v(n);
      // Few distinct values, so that ties across lanes and vectors are common.
      for (float& f : v) f = static_cast<float>(static_cast<int>(r.next() % 7)) - 3.0f;
      if (trial % 4 == 1) v[r.next() % n] = NAN;
      if (trial % 4 == 2) v[0] = NAN;
      if (trial % 4 == 3) std::fill(v.begin(), v.end(), -INFINITY);
      if (trial == 5) v[n - 1] = 100.0f;  // in the tail
      CHECK(argmax(v.data(), n) == reference(v));
    }
  }
}

TEST_CASE("embedding gathers and dequantizes rows") {
  const int32_t vocab = 7, dim = 20;
  std::vector<uint16_t> table(vocab * dim);
  const auto vals = test::random_floats(table.size(), 3);
  for (size_t i = 0; i < table.size(); ++i) table[i] = f32_to_bf16(vals[i]);
  const auto view = matrix_view::dense(dtype::bf16, table.data(), vocab, dim);
  const int32_t tokens[] = {6, 0, 6, 3};
  std::vector<float> out(4 * (dim + 2), -1.0f);
  embedding(view, tokens, 4, out.data(), dim + 2);
  for (int t = 0; t < 4; ++t) {
    for (int c = 0; c < dim; ++c) CHECK(out[t * (dim + 2) + c] == bf16_to_f32(table[tokens[t] * dim + c]));
    CHECK(out[t * (dim + 2) + dim] == -1.0f);
  }
}

}  // namespace troupe

#include "kernels/cpu/simd.hpp"

namespace troupe {

TEST_CASE("simd::exp is within 2 ulp of exp over the float range, 0 below it") {
  double worst = 0;
  for (float x = -103.0f; x < 88.7f; x += 0.0031f) {
    const float got = simd::exp(simd::splat(x))[0];
    const double want = std::exp(double(x));
    const float wf = static_cast<float>(want);
    if (wf < 1.18e-38f) {  // subnormal results: absolute error of a few units
      CHECK(std::fabs(got - want) <= 4 * 1.4e-45);
      continue;
    }
    const double ulp = std::nextafter(wf, INFINITY) - wf;
    const double err = std::fabs(got - want) / ulp;
    if (!(err <= worst)) worst = err;  // a NaN stays, and fails the bound
  }
  CHECK(worst <= 2.0);
  CHECK(simd::exp(simd::splat(-200.0f))[3] == 0.0f);
  CHECK(simd::exp(simd::splat(100.0f))[0] >= 3.4e38f);  // overflows as expf does
  CHECK(simd::exp(simd::splat(0.0f))[7] == 1.0f);
}

TEST_CASE("simd::store_f16 rounds as f32_to_f16: ties to even, subnormals, overflow, NaN") {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, -70000.0f, INFINITY, -INFINITY,
                           6.1035156e-05f, 6.0e-08f, 2.9802322e-08f, 2.9802326e-08f, 1.0e-45f, -3.0e-06f};
  // Exactly halfway between two F16 values, on both sides of even.
  for (uint32_t m : {1u, 2u, 3u, 1022u, 1023u})
    xs.push_back(std::ldexp(1.0f + (m + 0.5f) / 1024.0f, -3));
  rng r(31);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(r.next());
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isnan(f)) xs.push_back(f);
  }
  while (xs.size() % simd::width != 0) xs.push_back(0.5f);
  std::vector<uint16_t> got(xs.size());
  for (size_t i = 0; i < xs.size(); i += simd::width) simd::store_f16(got.data() + i, simd::load(xs.data() + i));
  int wrong = 0;
  for (size_t i = 0; i < xs.size(); ++i) wrong += got[i] != f32_to_f16(xs[i]);
  CHECK(wrong == 0);
  std::vector<float> nan(simd::width, NAN);
  simd::store_f16(got.data(), simd::load(nan.data()));
  CHECK(std::isnan(f16_to_f32(got[0])));
}

}  // namespace troupe
