// shard_push: a CPU shard's side of prefill/decode disaggregation.
//
// A prefill replica's shard sends the prompt blocks a plan names (kv_pushes) to its
// counterpart in the decode replica each names: the shard of the same layers and
// tensor-parallel slice, which listens on a KV channel (engine/kv/kv_channel.hpp). Blocks
// travel under the names the KV tiers use (shard_tiers.hpp: the shard's prefix, then the
// block's content address), so the two replicas agree on them without talking.
//
// The counterpart's landing (kv_landing) puts each record it takes into its shard's first
// tier, where the loads its scheduler plans for the handed-over request find them. A push
// waits until every destination has taken its blocks (2 s at most; a destination that lets
// the time pass, or breaks, is left alone for a second, doubling to 30 while it keeps
// failing), so a request's KV has landed before its prefill step answers. A block that
// cannot be sent (the decode replica is gone, its channel broke) is counted and left: its
// load fails there, and the decode replica computes it.
//
// shard_push: one thread at a time (the shard's). kv_landing: its connections' threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/forward/kv_cache.hpp"
#include "engine/kv/kv_channel.hpp"
#include "engine/kv/kv_tiers.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

// Where this shard's counterpart in decode replica `replica` takes blocks.
struct kv_peer {
  std::string replica;
  std::string host;
  uint16_t port = 0;
};

struct push_stats {
  uint64_t blocks = 0;  // sent
  uint64_t bytes = 0;
  uint64_t failed = 0;  // blocks not sent, and flushes not acknowledged in time
};

class shard_push {
 public:
  static constexpr std::chrono::milliseconds flush_timeout{2000};

  shard_push(std::string prefix, kv_cache& cache, std::vector<kv_peer> peers, kv_channel_limits limits = {});
  ~shard_push();
  shard_push(const shard_push&) = delete;
  shard_push& operator=(const shard_push&) = delete;

  // Sends the blocks of `pushes` (but those of the `failed` requests) and waits until
  // their destinations have taken them.
  void push(std::span<const tier_move> pushes, std::span<const request_id> failed);
  push_stats stats() const { return stats_; }

 private:
  struct destination {
    kv_peer peer;
    std::unique_ptr<kv_channel_sender> channel;
    std::chrono::steady_clock::time_point retry_at{};  // after a failure
    std::chrono::seconds backoff{1};                    // the next wait after a failure
  };
  destination* channel_to(const std::string& replica);  // connected, or null
  static void back_off(destination& d, std::chrono::steady_clock::time_point now);

  std::string prefix_;
  kv_cache& cache_;
  kv_channel_limits limits_;
  std::vector<destination> dests_;
  std::vector<std::byte> buf_;
  push_stats stats_;
};

// A decode replica shard's receiving end: records named under `prefix` go into `tiers`'
// first tier (and down, as any save); others are dropped and counted.
class kv_landing {
 public:
  // What its senders' peers did wrong is counted in `meter` too (none: only in stats()).
  static expected<std::unique_ptr<kv_landing>> start(const std::string& host, uint16_t port, std::string prefix,
                                                     std::shared_ptr<kv_tiers> tiers, std::shared_ptr<link_meter> meter = nullptr);
  uint16_t port() const { return receiver_->port(); }
  kv_channel_stats stats() const { return receiver_->stats(); }
  uint64_t foreign() const { return foreign_->load(); }  // records of another shard's prefix

 private:
  kv_landing() = default;
  std::shared_ptr<kv_tiers> tiers_;
  std::shared_ptr<std::atomic<uint64_t>> foreign_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::unique_ptr<kv_channel_receiver> receiver_;  // last: its threads go first
};

}  // namespace troupe
