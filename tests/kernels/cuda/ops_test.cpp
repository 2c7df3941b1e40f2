// Every CUDA kernel against its CPU reference on random inputs: odd sizes, strides that are
// not the row length, outputs poisoned with NaN before the kernel runs, and error bounds
// per dtype. Runs only where a CUDA device exists (see gpu_main.cpp).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/common/dtype.hpp"
#include "kernels/cpu/argmax.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/paged_attention.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/sample.hpp"
#include "kernels/cpu/silu_mul.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/cuda/argmax.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/gemv.hpp"
#include "kernels/cuda/paged_attention.hpp"
#include "kernels/cuda/prefill_attention.hpp"
#include "kernels/cuda/rmsnorm.hpp"
#include "kernels/cuda/rope.hpp"
#include "kernels/cuda/sample.hpp"
#include "kernels/cuda/silu_mul.hpp"

namespace troupe {

namespace {

std::vector<float> randoms(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

template <typename T>
cuda::buffer<T> on_device(const std::vector<T>& host) {
  cuda::buffer<T> b(host.size());
  b.upload(host);
  return b;
}

template <typename T>
cuda::buffer<T> poisoned(size_t n) {
  cuda::buffer<T> b(n);
  b.fill_bytes(0xFF);
  return b;
}

void sync() { cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

// x rounded to a 16-bit type and back (to_16 and from_16 as the device stores it).
uint16_t to_16(dtype t, float x) { return t == dtype::bf16 ? f32_to_bf16(x) : f32_to_f16(x); }
float from_16(dtype t, uint16_t x) { return t == dtype::bf16 ? bf16_to_f32(x) : f16_to_f32(x); }
// A 16-bit type's relative rounding step.
float half_ulp(dtype t) { return t == dtype::bf16 ? 1.0f / 128 : 1.0f / 1024; }

// |a - b| <= rel * max(1, |b|)
void close(float a, float b, float rel) { CHECK(std::fabs(a - b) <= rel * std::max(1.0f, std::fabs(b))); }

}  // namespace

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
    cuda::rmsnorm(out.get(), dx.get(), stride, dw.get(), rows, n, 1e-5f, nullptr);
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

TEST_CASE("silu_mul matches the CPU") {
  const int64_t n = 1007;
  auto gate = randoms(n, 7, 8.0f);
  const auto up = randoms(n, 8);
  auto dg = on_device(gate);
  auto du = on_device(up);
  cuda::silu_mul(dg.get(), du.get(), n, nullptr);
  sync();
  const auto got = dg.download();
  silu_mul(gate.data(), up.data(), static_cast<int32_t>(n));
  for (int64_t i = 0; i < n; ++i) close(got[i], gate[i], 2e-5f);
}

TEST_CASE("argmax takes the first of equal maxima, as the CPU does") {
  const int32_t rows = 9, n = 1001, stride = 1003;
  auto x = randoms(size_t(rows) * stride, 9);
  x[size_t(2) * stride + 500] = 50.0f;  // a tie: the first wins
  x[size_t(2) * stride + 7] = 50.0f;
  x[size_t(4) * stride + n - 1] = 60.0f;  // the last column
  auto dx = on_device(x);
  auto out = poisoned<int32_t>(rows);
  cuda::argmax(dx.get(), stride, rows, n, out.get(), nullptr);
  sync();
  const auto got = out.download();
  for (int32_t r = 0; r < rows; ++r) CHECK(got[r] == argmax(x.data() + size_t(r) * stride, n));
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

namespace {

void check_attention(int32_t head_dim) {
  const int32_t heads = 6, kv_heads = 2, block = 16, blocks = 64;
  const std::vector<int32_t> lengths{1, 37, 300};
  // Each sequence's blocks, scrambled across the pool.
  std::vector<uint32_t> pool_order(blocks);
  std::iota(pool_order.begin(), pool_order.end(), 0u);
  std::shuffle(pool_order.begin(), pool_order.end(), std::mt19937(11));
  const int32_t table_stride = 20;
  std::vector<uint32_t> tables(lengths.size() * table_stride, 0);
  size_t next = 0;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int32_t b = 0; b < (lengths[s] + block - 1) / block; ++b) tables[s * table_stride + b] = pool_order[next++];
  // Every position's K and V, written by the CPU into its cache and by the GPU into its own.
  const size_t cache = size_t(blocks) * kv_heads * block * head_dim;
  std::vector<float> k(cache, 0.0f), v(cache, 0.0f);
  paged_kv_layer host{k.data(), v.data(), blocks, kv_heads, block, head_dim};
  std::vector<int32_t> all_pos, all_seq;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int32_t p = 0; p < lengths[s]; ++p) {
      all_pos.push_back(p);
      all_seq.push_back(static_cast<int32_t>(s));
    }
  const int32_t row = kv_heads * head_dim;
  const auto keys = randoms(all_pos.size() * row, 12), vals = randoms(all_pos.size() * row, 13);
  for (size_t i = 0; i < all_pos.size(); ++i)
    paged_kv_write(host, tables.data() + size_t(all_seq[i]) * table_stride, all_pos[i], keys.data() + i * row,
                   vals.data() + i * row);
  auto dk = on_device(std::vector<float>(cache, 0.0f)), dv = on_device(std::vector<float>(cache, 0.0f));
  auto dkeys = on_device(keys), dvals = on_device(vals);
  auto dtables = on_device(tables);
  auto dall_pos = on_device(all_pos), dall_seq = on_device(all_seq);
  paged_kv_layer dev{dk.get(), dv.get(), blocks, kv_heads, block, head_dim};
  cuda::token_batch wb{dall_pos.get(), dall_seq.get(), dtables.get(), table_stride, static_cast<int32_t>(all_pos.size())};
  cuda::paged_kv_write(dev, dkeys.get(), dvals.get(), row, wb, nullptr);
  sync();
  CHECK(dk.download() == k);
  CHECK(dv.download() == v);

  // A step: the three sequences' last tokens (decode) and ten tokens of a prefill chunk.
  std::vector<int32_t> pos{0, 36, 299}, seq{0, 1, 2};
  for (int32_t p = 120; p < 130; ++p) {
    pos.push_back(p);
    seq.push_back(2);
  }
  const int32_t n = static_cast<int32_t>(pos.size()), q_stride = heads * head_dim + 5;
  const auto q = randoms(size_t(n) * q_stride, 14);
  std::vector<attention_token> toks;
  for (int32_t t = 0; t < n; ++t) toks.push_back({pos[t], tables.data() + size_t(seq[t]) * table_stride});
  std::vector<float> want(size_t(n) * heads * head_dim, NAN);
  thread_pool cpu(1);
  paged_attention(q.data(), q_stride, want.data(), heads * head_dim, toks.data(), n, heads, host, cpu);
  auto dq = on_device(q);
  auto dpos = on_device(pos), dseq = on_device(seq);
  const cuda::token_batch b{dpos.get(), dseq.get(), dtables.get(), table_stride, n};
  for (int32_t split : {32, 256, 512}) {  // many partials to merge, two, and one (no merge)
    CAPTURE(split);
    cuda::buffer<float> ws(cuda::paged_attention_workspace(n, heads, head_dim, 299, split));
    ws.fill_bytes(0xFF);
    auto out = poisoned<float>(want.size());
    cuda::paged_attention(dq.get(), q_stride, out.get(), heads * head_dim, b, heads, 299, dev, ws.get(), split, nullptr);
    sync();
    const auto got = out.download();
    for (size_t i = 0; i < want.size(); ++i) close(got[i], want[i], 1e-5f);
  }
  // The tiled prefill kernel on the same step: three one-row tiles (the decode tokens) and
  // one of the ten-token chunk.
  const std::vector<cuda::query_tile> tiles{{0, 1}, {1, 1}, {2, 1}, {3, 10}};
  auto dtiles = on_device(tiles);
  auto out = poisoned<float>(want.size());
  cuda::prefill_attention(dq.get(), q_stride, out.get(), heads * head_dim, b, dtiles.get(), 4, heads, dev, nullptr);
  sync();
  auto got = out.download();
  for (size_t i = 0; i < want.size(); ++i) close(got[i], want[i], 1e-5f);
  // A 40-token chunk at positions 200..239 of the third sequence: tiles of 16, 16 and 8
  // rows, the first starting mid-block.
  std::vector<int32_t> chunk_pos, chunk_seq;
  for (int32_t p = 200; p < 240; ++p) {
    chunk_pos.push_back(p);
    chunk_seq.push_back(2);
  }
  const int32_t m = static_cast<int32_t>(chunk_pos.size());
  const auto cq = randoms(size_t(m) * q_stride, 15);
  std::vector<attention_token> ctoks;
  for (int32_t t = 0; t < m; ++t) ctoks.push_back({chunk_pos[t], tables.data() + size_t(2) * table_stride});
  std::vector<float> cwant(size_t(m) * heads * head_dim, NAN);
  paged_attention(cq.data(), q_stride, cwant.data(), heads * head_dim, ctoks.data(), m, heads, host, cpu);
  auto dcq = on_device(cq);
  auto dcpos = on_device(chunk_pos), dcseq = on_device(chunk_seq);
  const cuda::token_batch cb{dcpos.get(), dcseq.get(), dtables.get(), table_stride, m};
  const std::vector<cuda::query_tile> ctiles{{0, 16}, {16, 16}, {32, 8}};
  auto dctiles = on_device(ctiles);
  auto chunk_out = poisoned<float>(cwant.size());
  cuda::prefill_attention(dcq.get(), q_stride, chunk_out.get(), heads * head_dim, cb, dctiles.get(), 3, heads, dev, nullptr);
  sync();
  got = chunk_out.download();
  for (size_t i = 0; i < cwant.size(); ++i) close(got[i], cwant[i], 1e-5f);
}

}  // namespace

TEST_CASE("paged KV write, split attention and tiled prefill attention (GQA, scrambled blocks, decode and prefill tokens) match the CPU") {
  for (int32_t head_dim : {16, 64, 128}) {  // 64 and 128 have unrolled kernels of their own
    CAPTURE(head_dim);
    check_attention(head_dim);
  }
}

TEST_CASE("cuBLAS GEMMs: FP32 exact to rounding, BF16 and FP16 within their precision") {
  const int32_t m = 5, n = 67, k = 129;
  const auto x = randoms(size_t(m) * k, 15), w = randoms(size_t(n) * k, 16);
  cudaStream_t stream = nullptr;
  cuda::gemm_engine gemm(stream);
  auto dx = on_device(x);
  auto y = poisoned<float>(size_t(m) * n);
  auto dw = on_device(w);
  gemm.f32(dx.get(), dw.get(), y.get(), m, n, k);
  sync();
  auto got = y.download();
  for (int32_t i = 0; i < m; ++i)
    for (int32_t j = 0; j < n; ++j) {
      double ref = 0;
      for (int32_t c = 0; c < k; ++c) ref += double(x[size_t(i) * k + c]) * w[size_t(j) * k + c];
      close(got[size_t(i) * n + j], static_cast<float>(ref), 1e-5f);
    }
  for (dtype t : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(t));
    std::vector<uint16_t> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) w16[i] = t == dtype::bf16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
    auto dw16 = on_device(w16);
    cuda::buffer<uint16_t> scratch(x.size());
    y.fill_bytes(0xFF);
    gemm.half(t, dx.get(), scratch.get(), dw16.get(), y.get(), m, n, k);
    sync();
    got = y.download();
    for (int32_t i = 0; i < m; ++i)
      for (int32_t j = 0; j < n; ++j) {
        // The reference rounds x and w as the device does, then sums exactly.
        double ref = 0;
        for (int32_t c = 0; c < k; ++c) {
          const float xr = t == dtype::bf16 ? bf16_to_f32(f32_to_bf16(x[size_t(i) * k + c])) : f16_to_f32(f32_to_f16(x[size_t(i) * k + c]));
          const float wr = t == dtype::bf16 ? bf16_to_f32(w16[size_t(j) * k + c]) : f16_to_f32(w16[size_t(j) * k + c]);
          ref += double(xr) * wr;
        }
        close(got[size_t(i) * n + j], static_cast<float>(ref), 1e-4f);
      }
  }
}

// The exact sum of x[i] . w[j] over k with both as the device holds them (16-bit).
std::vector<double> reference_16(dtype t, const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int32_t m,
                                 int32_t n, int32_t k) {
  std::vector<double> y(size_t(m) * n);
  for (int32_t i = 0; i < m; ++i)
    for (int32_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int32_t c = 0; c < k; ++c) acc += double(from_16(t, x[size_t(i) * k + c])) * from_16(t, w[size_t(j) * k + c]);
      y[size_t(i) * n + j] = acc;
    }
  return y;
}

TEST_CASE("GEMV for 1 to 8 rows and the 16-bit GEMMs: products, accumulation into y, odd column counts") {
  const int32_t n = 333, k = 1032;  // k: 129 loads of 8, not a multiple of the 4 x 32 unrolled loop
  cudaStream_t stream = nullptr;
  cuda::gemm_engine gemm(stream);
  for (dtype t : {dtype::bf16, dtype::f16}) {
    const auto wf = randoms(size_t(n) * k, 41);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = to_16(t, wf[i]);
    auto dw = on_device(w);
    for (int32_t m : {1, 2, 3, 5, 8, 9, 24}) {
      for (bool accumulate : {false, true}) {
        for (bool own : {true, false}) {
          CAPTURE(dtype_name(t));
          CAPTURE(m);
          CAPTURE(accumulate);
          CAPTURE(own);
          const auto xf = randoms(size_t(m) * k, 42 + m);
          std::vector<uint16_t> x(xf.size());
          for (size_t i = 0; i < x.size(); ++i) x[i] = to_16(t, xf[i]);
          const auto y0 = randoms(size_t(m) * n, 43);
          auto dx = on_device(x);
          auto dy = accumulate ? on_device(y0) : poisoned<float>(y0.size());
          if (own && cuda::gemv_fits(m, k)) {
            cuda::gemv(t, cuda::gemv_source{cuda::gemv_input::half, dx.get()}, dw.get(), dy.get(), m, n, k, accumulate, nullptr);
          } else {
            gemm.set_gemv_rows(own ? cuda::gemv_max_rows : 0);
            gemm.run(t, dx.get(), dw.get(), dy.get(), m, n, k, accumulate);
          }
          sync();
          const auto got = dy.download();
          const auto want = reference_16(t, x, w, m, n, k);
          for (size_t i = 0; i < got.size(); ++i)
            close(got[i], static_cast<float>(want[i] + (accumulate ? y0[i] : 0.0)), 1e-4f);
        }
      }
    }
  }
  CHECK(!cuda::gemv_fits(9, 1024));
  CHECK(!cuda::gemv_fits(1, 1030));
  cuda::buffer<uint16_t> x(1030), w(1030);
  cuda::buffer<float> y(1);
  CHECK_THROWS_AS(cuda::gemv(dtype::bf16, cuda::gemv_source{cuda::gemv_input::half, x.get()}, w.get(), y.get(), 1, 1, 1030,
                             false, nullptr),
                  cuda::cuda_error);
}

TEST_CASE("GEMV sources: f32 rows, rmsnorm and SiLU x up staged as the separate kernels would write them") {
  const int32_t n = 45, k = 264;
  for (dtype t : {dtype::bf16, dtype::f16}) {
    const auto wf = randoms(size_t(n) * k, 51);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = to_16(t, wf[i]);
    auto dw = on_device(w);
    const auto norm = randoms(k, 52);
    auto dnorm = on_device(norm);
    for (int32_t m : {1, 4, 8}) {
      for (cuda::gemv_input kind : {cuda::gemv_input::f32, cuda::gemv_input::rmsnorm, cuda::gemv_input::silu_mul}) {
        CAPTURE(dtype_name(t));
        CAPTURE(m);
        CAPTURE(static_cast<int>(kind));
        const int32_t width = kind == cuda::gemv_input::silu_mul ? 2 * k : k;
        const auto xf = randoms(size_t(m) * width, 53 + m, 3.0f);
        // What the separate kernel would have written, rounded to t, on the CPU.
        std::vector<uint16_t> x(size_t(m) * k);
        std::vector<float> row(k);
        for (int32_t r = 0; r < m; ++r) {
          const float* in = xf.data() + size_t(r) * width;
          if (kind == cuda::gemv_input::rmsnorm) {
            rmsnorm(row.data(), in, norm.data(), k, 1e-5f);
          } else {
            std::copy_n(in, k, row.begin());
            if (kind == cuda::gemv_input::silu_mul) silu_mul(row.data(), in + k, k);
          }
          for (int32_t i = 0; i < k; ++i) x[size_t(r) * k + i] = to_16(t, row[i]);
        }
        auto dx = on_device(xf);
        auto dy = poisoned<float>(size_t(m) * n);
        cuda::gemv(t, cuda::gemv_source{kind, dx.get(), dnorm.get(), 1e-5f}, dw.get(), dy.get(), m, n, k, false, nullptr);
        sync();
        const auto got = dy.download();
        const auto want = reference_16(t, x, w, m, n, k);
        // The GPU's floats may round to the other neighbour where the CPU's sit on a boundary.
        for (size_t i = 0; i < got.size(); ++i) close(got[i], static_cast<float>(want[i]), 4 * half_ulp(t));
      }
    }
  }
}

TEST_CASE("rope and KV write in one launch equal rope, then paged_kv_write") {
  const int32_t heads = 4, kv_heads = 2, head_dim = 12, rot = 8, block = 16, blocks = 8, positions_n = 100;
  const int32_t stride = (heads + 2 * kv_heads) * head_dim + 3, tokens = 5;
  std::vector<float> cos(size_t(positions_n) * rot / 2), sin(cos.size());
  rope_table(cos.data(), sin.data(), positions_n, rot, 10000.0f);
  const std::vector<int32_t> pos{0, 17, 18, 63, 99}, seq{0, 0, 0, 1, 1};
  const int32_t table_stride = 7;
  std::vector<uint32_t> tables(2 * table_stride, 0);
  for (int32_t b = 0; b < table_stride; ++b) {
    tables[b] = static_cast<uint32_t>((b * 3) % blocks);
    tables[table_stride + b] = static_cast<uint32_t>(blocks - 1 - b);
  }
  for (rope_layout layout : {rope_layout::pairs, rope_layout::halves}) {
    auto qkv = randoms(size_t(tokens) * stride, 61);
    const size_t cache = size_t(blocks) * kv_heads * block * head_dim;
    std::vector<float> k(cache, 0.0f), v(cache, 0.0f);
    paged_kv_layer host{k.data(), v.data(), blocks, kv_heads, block, head_dim};
    auto dqkv = on_device(qkv);
    for (int32_t t = 0; t < tokens; ++t) {
      float* row = qkv.data() + size_t(t) * stride;
      const size_t at = size_t(pos[t]) * rot / 2;
      rope(row, heads + kv_heads, head_dim, rot, cos.data() + at, sin.data() + at, layout);
      paged_kv_write(host, tables.data() + size_t(seq[t]) * table_stride, pos[t], row + heads * head_dim,
                     row + (heads + kv_heads) * head_dim);
    }
    auto dk = on_device(std::vector<float>(cache, 0.0f)), dv = on_device(std::vector<float>(cache, 0.0f));
    auto dcos = on_device(cos), dsin = on_device(sin);
    auto dpos = on_device(pos), dseq = on_device(seq);
    auto dtables = on_device(tables);
    const paged_kv_layer dev{dk.get(), dv.get(), blocks, kv_heads, block, head_dim};
    const cuda::token_batch b{dpos.get(), dseq.get(), dtables.get(), table_stride, tokens};
    cuda::rope_kv_write(dev, dqkv.get(), stride, heads, rot, dcos.get(), dsin.get(), layout, b, nullptr);
    sync();
    const auto got = dqkv.download();
    for (size_t i = 0; i < got.size(); ++i) close(got[i], qkv[i], 1e-5f);
    const auto gk = dk.download(), gv = dv.download();
    for (size_t i = 0; i < cache; ++i) {
      close(gk[i], k[i], 1e-5f);
      close(gv[i], v[i], 1e-5f);
    }
  }
}

TEST_CASE("sampling on the device draws the CPU's token for the same u: temperature, top-k, top-p, min-p, greedy") {
  const int32_t vocab = 5003, stride = vocab + 7;
  const std::vector<truncation> hows{
      {1.0f, 0, 1.0f, 0.0f},    {0.7f, 40, 1.0f, 0.0f}, {1.3f, 0, 0.9f, 0.0f},  {1.0f, 0, 1.0f, 0.05f},
      {0.8f, 50, 0.8f, 0.01f},  {0.0f, 0, 1.0f, 0.0f},  {1.0f, 1, 1.0f, 0.0f},  {0.05f, 0, 0.5f, 0.0f},
      {1.0f, 3000, 1.0f, 0.0f}, {2.5f, 0, 0.999f, 0.0f}};  // the last two keep more than 2,048
  const int32_t draws_per = 6, rows = static_cast<int32_t>(hows.size()) * draws_per;
  auto logits = randoms(size_t(rows) * stride, 71, 4.0f);
  for (int32_t r = 0; r < rows; ++r) {  // ties among the likely tokens
    logits[size_t(r) * stride + 10] = logits[size_t(r) * stride + 20] = 4.5f;
    logits[size_t(r) * stride + 30] = 4.5f;
  }
  std::vector<token_choice> choices(rows);
  std::mt19937 g(72);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int32_t r = 0; r < rows; ++r) choices[r] = {hows[r / draws_per], std::min(unit(g), 0.99999f)};
  auto dlogits = on_device(logits);
  auto dchoices = on_device(choices);
  cuda::buffer<float> ws(cuda::sample_workspace(rows, vocab));
  auto out = poisoned<int32_t>(rows);
  cuda::sample(dlogits.get(), stride, rows, vocab, dchoices.get(), ws.get(), out.get(), nullptr);
  sync();
  const auto got = out.download();
  sample_scratch scratch;
  int32_t near_boundary = 0;
  for (int32_t r = 0; r < rows; ++r) {
    const truncation& how = choices[r].how;
    const float u = choices[r].u;
    CAPTURE(r);
    CAPTURE(how.temperature);
    CAPTURE(how.top_k);
    CAPTURE(how.top_p);
    CAPTURE(how.min_p);
    CAPTURE(u);
    const float* row = logits.data() + size_t(r) * stride;
    if (how.temperature == 0.0f) {
      CHECK(got[r] == argmax(row, vocab));
      continue;
    }
    REQUIRE(got[r] >= 0);
    REQUIRE(got[r] < vocab);
    const size_t hows_index = size_t(r / draws_per);
    if (hows_index + 2 >= hows.size()) {
      // Drawn in index order: any token of the kept set, which holds every token at least as
      // likely as the least likely one the CPU keeps (its walk ends there as u nears 1).
      const int32_t last_kept = sample(row, vocab, how, 0.9999999f, scratch);
      CHECK(row[got[r]] >= row[last_kept] - 1e-5f);
      continue;
    }
    const int32_t want = sample(row, vocab, how, u, scratch);
    if (got[r] == want) continue;
    ++near_boundary;  // only a u within rounding of a boundary may go the other way
    CHECK((got[r] == sample(row, vocab, how, std::max(0.0f, u - 1e-4f), scratch) ||
           got[r] == sample(row, vocab, how, std::min(0.99999f, u + 1e-4f), scratch)));
  }
  CHECK(near_boundary <= 2);
}

}  // namespace troupe
