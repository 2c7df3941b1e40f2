// GEMMs on the device: cuBLAS in FP32 and 16-bit, and troupe's GEMV with each input
// source, against exact sums on the host.
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/silu_mul.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/gemv.hpp"

#include "tests/kernels/cuda/gpu_test_support.hpp"

namespace troupe {

using namespace gpu_test;

TEST_CASE("cuBLAS GEMMs: FP32 exact to rounding, BF16 and FP16 within their precision") {
  const int32_t m = 5, n = 67, k = 129;
  const auto x = randoms(size_t(m) * k, 15), w = randoms(size_t(n) * k, 16);
  cudaStream_t stream = nullptr;
  cuda::gemm_engine gemm(stream);
  auto dx = on_device(x);
  auto y = poisoned<float>(size_t(m) * n);
  auto dw = on_device(w);
  gemm.run(dtype::f32, dx.get(), dw.get(), y.get(), m, n, k, false);
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
    for (size_t i = 0; i < w.size(); ++i) w16[i] = to_16(t, w[i]);
    auto dw16 = on_device(w16);
    std::vector<uint16_t> x16(x.size());
    for (size_t i = 0; i < x.size(); ++i) x16[i] = to_16(t, x[i]);
    auto dx16 = on_device(x16);
    y.fill_bytes(0xFF);
    gemm.run(t, dx16.get(), dw16.get(), y.get(), m, n, k, false);  // m = 5: cuBLAS
    sync();
    got = y.download();
    const auto want = reference_16(t, x16, w16, m, n, k);
    for (size_t i = 0; i < got.size(); ++i) close(got[i], static_cast<float>(want[i]), 1e-4f);
  }
}

TEST_CASE("GEMV for 1 to 8 rows and the 16-bit GEMMs: products, accumulation into y, odd column counts") {
  const int32_t n = 333, k = 1032;  // k: 129 loads of 8, not a multiple of a block's 256 threads
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

}  // namespace troupe
