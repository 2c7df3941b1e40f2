// The elementwise CUDA kernels against their CPU references on random inputs: odd sizes,
// strides that are not the row length, outputs poisoned with NaN before the kernel runs,
// and error bounds per dtype. Runs only where a CUDA device exists (see gpu_main.cpp).
#include <numeric>

#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/silu_mul.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/rmsnorm.hpp"
#include "kernels/cuda/rope.hpp"
#include "kernels/cuda/silu_mul.hpp"

#include "tests/kernels/cuda/gpu_test_support.hpp"

namespace troupe {

using namespace gpu_test;

TEST_CASE("embedding: f32, f16 and bf16 tables gather the rows the CPU gathers") {
  const int32_t vocab = 37, dim = 67, n = 13, stride = 70;
  const auto table = randoms(size_t(vocab) * dim, 1);
  std::vector<int32_t> tokens(n);
  std::mt19937 g(2);
  for (auto& t : tokens) t = static_cast<int32_t>(g() % vocab);
  auto dtok = on_device(tokens);
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    CAPTURE(dtype_name(t));
    std::vector<uint16_t> half(table.size());
    for (size_t i = 0; i < table.size(); ++i) half[i] = t == dtype::bf16 ? f32_to_bf16(table[i]) : f32_to_f16(table[i]);
    const void* host = t == dtype::f32 ? static_cast<const void*>(table.data()) : half.data();
    std::vector<float> want(size_t(n) * stride, 0.0f);
    embedding(matrix_view::dense(t, host, vocab, dim), tokens.data(), n, want.data(), stride);
    cuda::buffer<float> dtable32;
    cuda::buffer<uint16_t> dtable16;
    const void* dev = nullptr;
    if (t == dtype::f32) {
      dtable32 = on_device(table);
      dev = dtable32.get();
    } else {
      dtable16 = on_device(half);
      dev = dtable16.get();
    }
    auto out = poisoned<float>(size_t(n) * stride);
    cuda::embedding(t, dev, dim, dim, dtok.get(), n, out.get(), stride, nullptr);
    sync();
    const auto got = out.download();
    for (int32_t r = 0; r < n; ++r)
      for (int32_t c = 0; c < dim; ++c) CHECK(got[size_t(r) * stride + c] == want[size_t(r) * stride + c]);
  }
}

TEST_CASE("rmsnorm over rows of odd length matches the CPU") {
  for (int32_t n : {67, 4099}) {
    CAPTURE(n);
    const int32_t rows = 5, stride = n + 3;
    const auto x = randoms(size_t(rows) * stride, 3, 4.0f);
    const auto w = randoms(n, 4);
    auto dx = on_device(x);
    auto dw = on_device(w);
    auto out = poisoned<float>(x.size());
    cuda::rmsnorm_to(dtype::f32, out.get(), stride, dx.get(), stride, dw.get(), rows, n, 1e-5f, nullptr);
    sync();
    const auto got = out.download();
    std::vector<float> want(n);
    for (int32_t r = 0; r < rows; ++r) {
      rmsnorm(want.data(), x.data() + size_t(r) * stride, w.data(), n, 1e-5f);
      for (int32_t i = 0; i < n; ++i) close(got[size_t(r) * stride + i], want[i], 2e-5f);
    }
  }
}

TEST_CASE("rmsnorm writes bf16 and f16 rows within one rounding of the CPU's floats") {
  const int32_t rows = 4, n = 1031, stride = n + 5, out_stride = n + 1;
  const auto x = randoms(size_t(rows) * stride, 31, 3.0f);
  const auto w = randoms(n, 32);
  auto dx = on_device(x);
  auto dw = on_device(w);
  std::vector<float> want(n);
  for (dtype t : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(t));
    auto out = poisoned<uint16_t>(size_t(rows) * out_stride);
    cuda::rmsnorm_to(t, out.get(), out_stride, dx.get(), stride, dw.get(), rows, n, 1e-5f, nullptr);
    sync();
    const auto got = out.download();
    for (int32_t r = 0; r < rows; ++r) {
      rmsnorm(want.data(), x.data() + size_t(r) * stride, w.data(), n, 1e-5f);
      for (int32_t i = 0; i < n; ++i) close(from_16(t, got[size_t(r) * out_stride + i]), want[i], half_ulp(t));
    }
  }
}

TEST_CASE("silu_mul over rows of [gate | up] writes f32, bf16 and f16 as the CPU computes") {
  const int32_t rows = 3, n = 517;
  const auto gu = randoms(size_t(rows) * 2 * n, 33, 6.0f);
  auto dgu = on_device(gu);
  std::vector<float> want(size_t(rows) * n);
  for (int32_t r = 0; r < rows; ++r) {
    std::copy_n(gu.data() + size_t(r) * 2 * n, n, want.data() + size_t(r) * n);
    silu_mul(want.data() + size_t(r) * n, gu.data() + size_t(r) * 2 * n + n, n);
  }
  auto out32 = poisoned<float>(want.size());
  cuda::silu_mul_rows(dgu.get(), rows, n, dtype::f32, out32.get(), nullptr);
  sync();
  const auto got32 = out32.download();
  for (size_t i = 0; i < want.size(); ++i) close(got32[i], want[i], 2e-5f);
  for (dtype t : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(t));
    auto out = poisoned<uint16_t>(want.size());
    cuda::silu_mul_rows(dgu.get(), rows, n, t, out.get(), nullptr);
    sync();
    const auto got = out.download();
    for (size_t i = 0; i < want.size(); ++i) close(from_16(t, got[i]), want[i], half_ulp(t));
  }
}

TEST_CASE("rope, pairs and halves, partial rotary dims, per-token positions") {
  const int32_t tokens = 7, heads = 3, head_dim = 10, rot = 8, stride = heads * head_dim + 2, positions_n = 64;
  std::vector<float> cos(size_t(positions_n) * rot / 2), sin(cos.size());
  rope_table(cos.data(), sin.data(), positions_n, rot, 10000.0f);
  std::vector<int32_t> pos(tokens);
  std::mt19937 g(5);
  for (auto& p : pos) p = static_cast<int32_t>(g() % positions_n);
  auto dcos = on_device(cos), dsin = on_device(sin);
  auto dpos = on_device(pos);
  for (rope_layout layout : {rope_layout::pairs, rope_layout::halves}) {
    auto v = randoms(size_t(tokens) * stride, 6);
    auto dv = on_device(v);
    cuda::rope(dv.get(), stride, tokens, heads, head_dim, rot, dcos.get(), dsin.get(), dpos.get(), layout, nullptr);
    sync();
    const auto got = dv.download();
    for (int32_t t = 0; t < tokens; ++t) {
      float* row = v.data() + size_t(t) * stride;
      rope(row, heads, head_dim, rot, cos.data() + size_t(pos[t]) * rot / 2, sin.data() + size_t(pos[t]) * rot / 2, layout);
      for (int32_t i = 0; i < stride; ++i) close(got[size_t(t) * stride + i], row[i], 1e-5f);
    }
  }
}

TEST_CASE("conversions round to nearest even, bit for bit as the CPU's") {
  auto x = randoms(4099, 10, 70000.0f);
  x.push_back(1e-7f);   // an f16 subnormal
  x.push_back(-3e-39f);  // an f32 subnormal
  x.push_back(65519.0f);
  x.push_back(1e9f);    // f16 overflow
  const int64_t n = static_cast<int64_t>(x.size());
  auto dx = on_device(x);
  auto h = poisoned<uint16_t>(x.size());
  auto back = poisoned<float>(x.size());
  cuda::f32_to_bf16(dx.get(), h.get(), n, nullptr);
  cuda::bf16_to_f32(h.get(), back.get(), n, nullptr);
  sync();
  auto bits = h.download();
  auto vals = back.download();
  for (int64_t i = 0; i < n; ++i) {
    CHECK(bits[i] == f32_to_bf16(x[i]));
    CHECK(vals[i] == bf16_to_f32(bits[i]));
  }
  cuda::f32_to_f16(dx.get(), h.get(), n, nullptr);
  cuda::f16_to_f32(h.get(), back.get(), n, nullptr);
  sync();
  bits = h.download();
  vals = back.download();
  for (int64_t i = 0; i < n; ++i) {
    CHECK(bits[i] == f32_to_f16(x[i]));
    CHECK(vals[i] == f16_to_f32(bits[i]));
  }
}

}  // namespace troupe
