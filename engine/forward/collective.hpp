// collective: the reduction between the tensor-parallel shards of one stage. A shard
// calls all_reduce_sum with its partial sums; on return every shard holds the same total,
// summed in rank order (so every shard, and every run, gets identical bits).
//
// local_collective_group: the shards are threads of one process (the CPU case). Each
// rank uses member(rank) from its own thread; all ranks must call with the same n. When a
// rank dies, abort() releases the others: their all_reduce_sum throws collective_aborted,
// then and ever after.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe {

class collective {
 public:
  virtual ~collective() = default;
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
};

// The single-shard case: nothing to reduce.
class no_collective final : public collective {
 public:
  void all_reduce_sum(float*, int64_t) override {}
};

struct collective_aborted : std::runtime_error {
  collective_aborted() : std::runtime_error("the tensor-parallel group was aborted (a peer died)") {}
  explicit collective_aborted(const std::string& why) : std::runtime_error(why) {}
};

class local_collective_group {
 public:
  explicit local_collective_group(int32_t size);
  ~local_collective_group();
  collective& member(int32_t rank);
  int32_t size() const { return size_; }
  void abort();
  bool aborted() const { return aborted_.load(); }
  // Ranks waiting at the group's barrier now, for peers that have not come (diagnostics
  // and tests).
  int32_t num_waiting() const { return arrived_.load(std::memory_order_acquire); }

 private:
  class member_impl;
  void arrive_and_wait();  // a barrier that abort() breaks

  int32_t size_;
  std::atomic<int32_t> arrived_{0};
  std::atomic<uint32_t> phase_{0};
  std::atomic<bool> aborted_{false};
  std::vector<float*> buffers_;
  std::vector<float> sum_;
  std::vector<std::unique_ptr<member_impl>> members_;
};

}  // namespace troupe
