#include "tools/troupe-perf/triad.hpp"

#include <algorithm>
#include <chrono>
#include <memory>

#include "kernels/cpu/simd.hpp"

namespace troupe::tools {

bandwidth measure_bandwidth(thread_pool& pool, size_t bytes_per_array, int runs) {
  const size_t n = bytes_per_array / sizeof(float);
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  // First touch from the threads that will use each part.
  pool.parallel_for(static_cast<int64_t>(n), 4096, [&](int64_t lo, int64_t hi, int) {
    for (int64_t i = lo; i < hi; ++i) {
      a[i] = 0.0f;
      b[i] = 1.0f;
      c[i] = 2.0f;
    }
  });
  bandwidth best{0, 0};
  volatile float sink = 0;
  for (int r = 0; r < runs; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(static_cast<int64_t>(n), 4096, [&](int64_t lo, int64_t hi, int) {
      for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + 3.0f * c[i];
    });
    auto t1 = std::chrono::steady_clock::now();
    float sums[64] = {};
    pool.parallel_for(static_cast<int64_t>(n), 4096, [&](int64_t lo, int64_t hi, int t) {
      simd::v16f s0 = simd::zero(), s1 = s0, s2 = s0, s3 = s0;
      int64_t i = lo;
      for (; i + 64 <= hi; i += 64) {
        s0 += simd::load(&a[i]);
        s1 += simd::load(&a[i + 16]);
        s2 += simd::load(&a[i + 32]);
        s3 += simd::load(&a[i + 48]);
      }
      float s = simd::reduce_add(s0 + s1 + s2 + s3);
      for (; i < hi; ++i) s += a[i];
      sums[t % 64] = s;
    });
    auto t2 = std::chrono::steady_clock::now();
    sink = sink + sums[0];
    const double triad = 3.0 * bytes_per_array / std::chrono::duration<double>(t1 - t0).count() / 1e9;
    const double read = 1.0 * bytes_per_array / std::chrono::duration<double>(t2 - t1).count() / 1e9;
    best.triad_gbs = std::max(best.triad_gbs, triad);
    best.read_gbs = std::max(best.read_gbs, read);
  }
  return best;
}

}  // namespace troupe::tools
