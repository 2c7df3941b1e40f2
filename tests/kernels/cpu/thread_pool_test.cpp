#include "kernels/cpu/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <utility>
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

TEST_CASE("parallel_for_stripes hands out each grain-sized range exactly once, with the end of its thread's stripe") {
  for (int threads : {1, 2, 3})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{40}, int64_t{1000}}) {
      CAPTURE(threads);
      CAPTURE(n);
      const int64_t grain = 16, chunks = (n + grain - 1) / grain;
      const int used = static_cast<int>(std::min<int64_t>(chunks, threads));
      // The stripes: whole ranges, as even as they come, the last one ending at n.
      std::vector<int64_t> ends;
      for (int i = 1; i <= used; ++i) ends.push_back(std::min(chunks * i / used * grain, n));
      thread_pool pool(threads);
      for (int rep = 0; rep < 3; ++rep) {  // the cursors start afresh each time
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> bad{0};
        pool.parallel_for_stripes(n, grain, [&](int64_t b, int64_t e, int64_t stripe_end, int idx) {
          const int64_t want = *std::upper_bound(ends.begin(), ends.end(), b);
          if (b % grain != 0 || e != std::min(b + grain, n) || stripe_end != want || idx < 0 || idx >= threads)
            ++bad;
          for (int64_t i = b; i < e; ++i) ++hits[i];
        });
        for (int64_t i = 0; i < n; ++i) CHECK(hits[i] == 1);
        CHECK(bad == 0);
      }
    }
}

TEST_CASE("parallel_for_stripes: a thread held up leaves its stripe to the others") {
  // Thread 0 holds on to the first range it takes until the other thread has taken every
  // other range (or ten seconds have passed): the rest of thread 0's stripe among them.
  thread_pool pool(2);
  const int64_t chunks = 64;
  std::atomic<int64_t> done{0};
  std::atomic<int> by_first{0};
  bool first = true;  // thread 0's alone
  pool.parallel_for_stripes(chunks * 16, 16, [&](int64_t, int64_t, int64_t, int idx) {
    if (idx == 0) {
      ++by_first;
      if (std::exchange(first, false)) {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (done.load() < chunks - 1 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
      }
    }
    ++done;
  });
  CHECK(done == chunks);
  CHECK(by_first == 1);
}

TEST_CASE("many short regions in a row complete (no lost wake-ups)") {
  thread_pool pool(3);
  std::atomic<int64_t> sum{0};
  for (int i = 0; i < 5000; ++i) pool.parallel_for(3, 1, [&](int64_t b, int64_t e, int) { sum += e - b; });
  CHECK(sum == 15000);
}

}  // namespace troupe
