#include "engine/forward/collective.hpp"

#include <cstring>

namespace troupe {

class local_collective_group::member_impl final : public collective {
 public:
  member_impl(local_collective_group& g, int32_t rank) : g_(g), rank_(rank) {}

  void all_reduce_sum(float* data, int64_t n) override {
    g_.buffers_[rank_] = data;
    if (rank_ == 0 && static_cast<int64_t>(g_.sum_.size()) < n) g_.sum_.resize(n);
    g_.arrive_and_wait();  // every buffer published, sum_ sized
    // Each rank sums its own share of the elements, over all ranks in rank order.
    const int64_t b = n * rank_ / g_.size_, e = n * (rank_ + 1) / g_.size_;
    for (int64_t i = b; i < e; ++i) {
      float s = g_.buffers_[0][i];
      for (int32_t r = 1; r < g_.size_; ++r) s += g_.buffers_[r][i];
      g_.sum_[i] = s;
    }
    g_.arrive_and_wait();  // the sum is complete
    std::memcpy(data, g_.sum_.data(), sizeof(float) * n);
    g_.arrive_and_wait();  // nobody still reads sum_ or the buffers
  }

 private:
  local_collective_group& g_;
  int32_t rank_;
};

local_collective_group::~local_collective_group() = default;

void local_collective_group::arrive_and_wait() {
  const uint32_t phase = phase_.load(std::memory_order_acquire);
  if (aborted_.load(std::memory_order_acquire)) throw collective_aborted{};
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size_) {
    arrived_.store(0, std::memory_order_relaxed);
    phase_.fetch_add(1, std::memory_order_release);
    phase_.notify_all();
    return;
  }
  // Peers arrive within microseconds in a step: spin briefly before sleeping.
  // abort() sets aborted_ before it moves the phase: a moved phase is checked for it.
  for (int spin = 0; spin < 20000; ++spin)
    if (phase_.load(std::memory_order_acquire) != phase) {
      if (aborted_.load(std::memory_order_acquire)) throw collective_aborted{};
      return;
    }
  phase_.wait(phase, std::memory_order_acquire);
  if (aborted_.load(std::memory_order_acquire)) throw collective_aborted{};
}

void local_collective_group::abort() {
  aborted_.store(true, std::memory_order_release);
  phase_.fetch_add(1, std::memory_order_release);  // wakes the sleepers, who then see aborted_
  phase_.notify_all();
}

collective& local_collective_group::member(int32_t rank) { return *members_[rank]; }

local_collective_group::local_collective_group(int32_t size)
    : size_(size), buffers_(size) {
  for (int32_t r = 0; r < size; ++r) members_.push_back(std::make_unique<member_impl>(*this, r));
}

}  // namespace troupe
