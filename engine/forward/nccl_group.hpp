// nccl_group: GPU shards that exchange over NCCL: the tensor-parallel shards of one
// pipeline stage, adding their partial sums (the GPU counterpart of collective.hpp's local
// group), and a device link between neighbouring stages, over which the earlier stage's
// rank 0 sends its hidden states to every rank of the next.
//
// NCCL (libnccl.so.2) is loaded when the first group is made, not linked: builds and GPU
// bundles that never use it run without it, and where it cannot be loaded, create() says
// why (a stage then sums through host memory instead: cuda_shard_options::host_group, and
// its activations travel through the host).
//
// create(size) draws NCCL's unique id, the 128 bytes every rank needs to connect; a stage
// sends them to each of its shards in a message (actors/wire/control_codec.hpp), and each
// shard joins with join(size, id). The ranks of one process share one group object (join
// finds it by id), so that one abort() reaches them all. Each rank's shard then connects
// on its own thread (nccl_member, which returns once every rank has connected). The ranks'
// communicators are non-blocking, and every wait polls: abort() releases ranks waiting
// on a peer that died (connecting, or inside a step's all-reduce or transfer), whose wait
// then throws collective_aborted, then and ever after.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
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

class nccl_group {
 public:
  // A new group of `size` ranks, with a fresh unique id.
  static expected<std::shared_ptr<nccl_group>> create(int32_t size);
  // The group of `id`: the one alive in this process, else a new object for it (the
  // group was created in another process). Refused when the sizes disagree.
  static expected<std::shared_ptr<nccl_group>> join(int32_t size, const nccl_unique_id& id);

  int32_t size() const { return size_; }
  const nccl_unique_id& id() const { return id_; }
  void abort() { aborted_.store(true, std::memory_order_release); }
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

 private:
  nccl_group(int32_t size, const nccl_unique_id& id) : size_(size), id_(id) {}
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
  // Throws collective_aborted when the group has been aborted or has failed; never waits.
  // (A shard waiting for its stream polls this.)
  virtual void check() = 0;
};

// One rank's NCCL communicator, owned by its shard and used from one thread at a time.
// Operations are queued on the caller's stream; an NCCL failure aborts the group too, for
// the other ranks.
class nccl_member final : public gpu_collective {
 public:
  // Connects rank `rank` on CUDA device `device` and waits for the other ranks (at most
  // `connect_timeout`, when it is not zero). Throws collective_aborted when the group is
  // aborted or the time runs out meanwhile, std::runtime_error when NCCL fails.
  nccl_member(std::shared_ptr<nccl_group> group, int32_t rank, int device,
              std::chrono::milliseconds connect_timeout = std::chrono::milliseconds::zero());
  ~nccl_member() override;
  nccl_member(const nccl_member&) = delete;
  nccl_member& operator=(const nccl_member&) = delete;

  int32_t rank() const;
  const nccl_group& group() const;

  void all_reduce_sum(float* data, int64_t n, CUstream_st* stream) override;
  void check() override;
  // Rank 0: data[0, n) to every other rank (NCCL send/recv, one send per rank in one NCCL
  // group call). Each receives with receive_from_first, in the same order of transfers.
  void send_to_all(const float* data, int64_t n, CUstream_st* stream);
  // Any other rank: data[0, n) := what rank 0 sent.
  void receive_from_first(float* data, int64_t n, CUstream_st* stream);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
