// gpu_tp_group: the tensor-parallel shards of one pipeline stage on GPUs, adding their
// partial sums over NCCL (the GPU counterpart of collective.hpp's local group).
//
// NCCL (libnccl.so.2) is loaded when the first group is made, not linked: builds and GPU
// bundles that never split a stage over GPUs run without it, and where it cannot be
// loaded, create() says why (a stage then sums through host memory instead:
// cuda_shard_options::host_group).
//
// create(size) draws NCCL's unique id, the 128 bytes every rank needs to connect; a stage
// sends them to each of its shards in a message (actors/wire/control_codec.hpp), and each
// shard joins with join(size, id). The ranks of one process share one group object (join
// finds it by id), so that one abort() reaches them all. Each rank's shard then connects
// on its own thread (gpu_tp_member, which returns once every rank has connected). The ranks'
// communicators are non-blocking, and every wait polls: abort() releases ranks waiting
// on a peer that died (connecting, or inside a step's all-reduce), whose wait then throws
// collective_aborted, then and ever after.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

#include "engine/util/expected.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace troupe {

struct nccl_unique_id {
  std::array<char, 128> bytes{};
};

// Whether NCCL can be loaded in this process (the error says why not).
status nccl_usable();

class gpu_tp_group {
 public:
  // A new group of `size` ranks, with a fresh unique id.
  static expected<std::shared_ptr<gpu_tp_group>> create(int32_t size);
  // The group of `id`: the one alive in this process, else a new object for it (the
  // group was created in another process). Refused when the sizes disagree.
  static expected<std::shared_ptr<gpu_tp_group>> join(int32_t size, const nccl_unique_id& id);

  int32_t size() const { return size_; }
  const nccl_unique_id& id() const { return id_; }
  void abort() { aborted_.store(true, std::memory_order_release); }
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

 private:
  gpu_tp_group(int32_t size, const nccl_unique_id& id) : size_(size), id_(id) {}
  int32_t size_;
  nccl_unique_id id_;
  std::atomic<bool> aborted_{false};
};

// How a GPU shard of a tensor-parallel stage sums its partials with its peers'.
class gpu_collective {
 public:
  virtual ~gpu_collective() = default;
  // Queues data[0, n) (device memory) := its sum over the ranks, on `stream` (it may also
  // wait for the stream).
  virtual void all_reduce_sum(float* data, int64_t n, CUstream_st* stream) = 0;
  // Waits until `stream` is idle. Throws collective_aborted when the group is aborted or
  // fails meanwhile.
  virtual void wait(CUstream_st* stream) = 0;
};

// One rank's NCCL communicator, owned by its shard and used from one thread at a time.
class gpu_tp_member final : public gpu_collective {
 public:
  // Connects rank `rank` on CUDA device `device` and waits for the other ranks. Throws
  // collective_aborted when the group is aborted meanwhile, std::runtime_error when NCCL
  // fails.
  gpu_tp_member(std::shared_ptr<gpu_tp_group> group, int32_t rank, int device);
  ~gpu_tp_member() override;
  gpu_tp_member(const gpu_tp_member&) = delete;
  gpu_tp_member& operator=(const gpu_tp_member&) = delete;

  void all_reduce_sum(float* data, int64_t n, CUstream_st* stream) override;
  // (An NCCL failure aborts the group too, for the other ranks.)
  void wait(CUstream_st* stream) override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
