#include "kernels/cpu/thread_pool.hpp"

#include "kernels/common/assert.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define TROUPE_PAUSE() _mm_pause()
#else
#define TROUPE_PAUSE() ((void)0)
#endif

namespace troupe {

namespace {
// About 100-200 microseconds of polling before a worker sleeps: long enough to bridge the
// serial gaps inside a decode step, short enough not to burn an idle core.
constexpr int spin_iterations = 4000;
}  // namespace

thread_pool::thread_pool(int num_threads)
    : num_threads_(num_threads < 1 ? 1 : num_threads), stripes_(std::make_unique<stripe[]>(num_threads_)) {
  threads_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) threads_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::~thread_pool() {
  stop_ = true;
  epoch_.fetch_add(1, std::memory_order_release);
  epoch_.notify_all();
  for (auto& t : threads_) t.join();
}

void thread_pool::run(int used, task_fn fn, void* ctx) {
  TROUPE_ASSERT(used >= 2 && used <= num_threads_, used, num_threads_);
  fn_ = fn;
  ctx_ = ctx;
  used_ = used;
  // Every worker acknowledges every task, even one it takes no part in, so none can
  // still be reading fn_ or used_ when the next task is published.
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
  fn(ctx, 0);
  // Yield after a while, so that a worker descheduled on an oversubscribed machine runs.
  for (int i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
    if (i < spin_iterations)
      TROUPE_PAUSE();
    else
      std::this_thread::yield();
  }
}

void thread_pool::worker_loop(int idx) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t e = epoch_.load(std::memory_order_acquire);
    for (int i = 0; e == seen && i < spin_iterations; ++i) {
      TROUPE_PAUSE();
      e = epoch_.load(std::memory_order_acquire);
    }
    if (e == seen) {
      // Announce the sleep before the last look, so a publisher either sees the sleeper
      // (and wakes it) or the sleeper sees the new epoch.
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      if (epoch_.load(std::memory_order_seq_cst) == seen) epoch_.wait(seen, std::memory_order_acquire);
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      continue;
    }
    seen = e;
    if (stop_) return;
    if (idx < used_) fn_(ctx_, idx);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace troupe
