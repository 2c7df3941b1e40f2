#include "kernels/cpu/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <vector>

#include <doctest/doctest.h>

namespace troupe {

TEST_CASE("parallel_for covers every index exactly once, in grain-aligned ranges") {
  for (int threads : {1, 2, 3, 5})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1000}})
      for (int64_t grain : {int64_t{1}, int64_t{4}, int64_t{16}}) {
        thread_pool pool(threads);
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> bad_alignment{0};
        for (int rep = 0; rep < 3; ++rep)
          pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int idx) {
            if (b % grain != 0 || idx < 0 || idx >= threads) ++bad_alignment;
            for (int64_t i = b; i < e; ++i) ++hits[i];
          });
        for (int64_t i = 0; i < n; ++i) CHECK(hits[i] == 3);
        CHECK(bad_alignment == 0);
      }
}

TEST_CASE("parallel_for_chunks hands out each grain-sized range exactly once, the last cut at n") {
  for (int threads : {1, 2, 3})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{1000}}) {
      CAPTURE(threads);
      CAPTURE(n);
      const int64_t grain = 16;
      thread_pool pool(threads);
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> bad{0};
      pool.parallel_for_chunks(n, grain, [&](int64_t b, int64_t e, int idx) {
        if (b % grain != 0 || e != std::min(b + grain, n) || idx < 0 || idx >= threads) ++bad;
        for (int64_t i = b; i < e; ++i) ++hits[i];
      });
      for (int64_t i = 0; i < n; ++i) CHECK(hits[i] == 1);
      CHECK(bad == 0);
    }
}

TEST_CASE("many short regions in a row complete (no lost wake-ups)") {
  thread_pool pool(3);
  std::atomic<int64_t> sum{0};
  for (int i = 0; i < 5000; ++i) pool.parallel_for(3, 1, [&](int64_t b, int64_t e, int) { sum += e - b; });
  CHECK(sum == 15000);
}

}  // namespace troupe
