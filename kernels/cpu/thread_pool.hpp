// thread_pool: fork-join parallelism for kernels. The calling thread takes part as worker
// 0; num_threads - 1 threads wait for work, spinning briefly before they sleep, so the
// many short parallel regions of a decode step cost a few hundred nanoseconds each.
//
// Owned by one engine object (a shard); only one thread may call parallel_for at a time.
// parallel_for splits work statically, so which thread computes which rows never depends
// on timing; parallel_for_dynamic and parallel_for_stripes hand work out as threads become
// free, for work whose results do not depend on which thread computes them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace troupe {

class thread_pool {
 public:
  explicit thread_pool(int num_threads = 1);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(i, thread_idx) for every i in [0, n), handing items out one at a time to
  // whichever thread is free: for items of uneven cost. Which thread computes an item
  // must not matter to the result.
  template <class Fn>
  void parallel_for_dynamic(int64_t n, Fn&& fn) {
    if (n <= 0) return;
    if (num_threads_ == 1 || n == 1) {
      for (int64_t i = 0; i < n; ++i) fn(i, 0);
      return;
    }
    std::atomic<int64_t> next{0};
    auto body = [&](int idx) {
      for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
           i = next.fetch_add(1, std::memory_order_relaxed))
        fn(i, idx);
    };
    const int used = n < num_threads_ ? static_cast<int>(n) : num_threads_;
    run(used, [](void* ctx, int idx) { (*static_cast<decltype(body)*>(ctx))(idx); }, &body);
  }

  // Calls fn(begin, end, stripe_end, thread_idx) on the ranges [k * grain, (k + 1) *
  // grain) covering [0, n) (the last one cut at n). [0, n) is cut into one stripe of whole
  // ranges per thread; each thread takes the ranges of its own stripe front to back, then
  // helps the others with theirs, so that a thread mostly runs through one contiguous
  // stripe (as a stream from memory wants) and a thread slowed down takes fewer.
  // stripe_end is the end of the stripe the range lies in: where the thread that took it
  // most likely stops. Which thread computes a range must not matter to the result.
  template <class Fn>
  void parallel_for_stripes(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    const int64_t chunks = (n + grain - 1) / grain;
    const int used = chunks < num_threads_ ? static_cast<int>(chunks) : num_threads_;
    stripe* stripes = stripes_.get();
    for (int i = 0; i < used; ++i) {
      stripes[i].next.store(chunks * i / used, std::memory_order_relaxed);
      stripes[i].end = chunks * (i + 1) / used;
    }
    auto body = [&](int idx) {
      for (int k = 0; k < used; ++k) {
        stripe& s = stripes[(idx + k) % used];
        const int64_t stripe_end = s.end * grain < n ? s.end * grain : n;
        for (int64_t c = s.next.fetch_add(1, std::memory_order_relaxed); c < s.end;
             c = s.next.fetch_add(1, std::memory_order_relaxed)) {
          const int64_t b = c * grain;
          fn(b, b + grain < n ? b + grain : n, stripe_end, idx);
        }
      }
    };
    if (used == 1) return body(0);
    run(used, [](void* ctx, int idx) { (*static_cast<decltype(body)*>(ctx))(idx); }, &body);
  }

  // Calls fn(begin, end, thread_idx) on disjoint ranges covering [0, n), each range
  // a multiple of `grain` except the last; returns when all calls have returned.
  template <class Fn>
  void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    const int64_t chunks = (n + grain - 1) / grain;
    const int used = chunks < num_threads_ ? static_cast<int>(chunks) : num_threads_;
    if (used <= 1) {
      fn(int64_t{0}, n, 0);
      return;
    }
    auto body = [&](int idx) {
      const int64_t c0 = chunks * idx / used;
      const int64_t c1 = chunks * (idx + 1) / used;
      const int64_t b = c0 * grain;
      const int64_t e = c1 * grain < n ? c1 * grain : n;
      if (b < e) fn(b, e, idx);
    };
    run(used, [](void* ctx, int idx) { (*static_cast<decltype(body)*>(ctx))(idx); }, &body);
  }

 private:
  // parallel_for_stripes' cursors, one cache line each.
  struct alignas(64) stripe {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };

  using task_fn = void (*)(void* ctx, int thread_idx);
  void run(int used, task_fn fn, void* ctx);
  void worker_loop(int idx);

  int num_threads_;
  std::vector<std::thread> threads_;
  std::unique_ptr<stripe[]> stripes_;
  // A task is published by bumping epoch_; workers with idx < used_ run it.
  alignas(64) std::atomic<uint64_t> epoch_{0};
  alignas(64) std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};  // workers blocked in epoch_.wait (notify only if any)
  task_fn fn_ = nullptr;
  void* ctx_ = nullptr;
  int used_ = 0;
  bool stop_ = false;
};

}  // namespace troupe
