// kv_codec: block claims between a scheduler and its kv manager (schema/kv.capnp).
//
// kv_claim_sender (scheduler side) sends a request's tokens once: whole when it is
// admitted, then only the tokens added since. It keeps the last claims, so the answer is
// checked against them: grants for the first claims in order, each starting where its
// request stands, with added blocks inside the pool that make its table cover what they
// grant.
//
// kv_claim_receiver (kv manager side) keeps every claimed request's tokens, checks each
// message against its limits, and rebuilds the engine's kv_step_request from it. A
// message that fails a check changes nothing.
//
// A session ties the two: a reset message starts one, and only its messages are served
// after. A kv manager that restarted knows no session, so it refuses the claims of a
// scheduler that has not reset it, and the scheduler learns that its blocks are gone.
//
// One sender per scheduler, one receiver per kv manager; each used by one thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv/kv_block_manager.hpp"
#include "engine/sched/request.hpp"
#include "engine/util/expected.hpp"

namespace troupe::wire {

struct kv_limits {
  uint32_t num_blocks = 0;   // block ids must be below this
  int32_t block_size = 16;
  int32_t context = 0;       // tokens per sequence at most
  int32_t max_claims = 1024; // claims per message
  int32_t max_releases = 1 << 16;
  int32_t max_evicting_tokens = 1 << 20;  // tokens of a request with a KV budget, which may
                                          // run past the context
};

class kv_claim_sender {
 public:
  explicit kv_claim_sender(const kv_limits& lim) : lim_(lim) {}
  // The next message resets the kv manager and serves `session` from then on.
  void restart(uint64_t session);
  uint64_t session() const { return session_; }
  std::vector<uint8_t> encode(const kv_step_request& q);
  // The answer to the last encode().
  expected<kv_step_grants> decode(std::span<const uint8_t> bytes) const;

 private:
  struct sent_claim {
    request_id id;
    bool admit = false;
    int32_t computed = 0;
    int32_t held = 0;
    int32_t total = 0;        // tokens
    int32_t speculative = 0;  // draft positions after them
    int32_t evicted = 0;      // tokens gone from its cache
    int32_t kv_budget = 0;
  };
  kv_limits lim_;
  std::unordered_map<request_id, int32_t> known_;  // tokens the kv manager has, per request
  std::vector<sent_claim> last_;
  uint64_t session_ = 0;
  bool reset_pending_ = true;
};

struct decoded_kv_step {
  bool reset = false;       // start afresh (a new block manager) before granting
  uint64_t session = 0;
  kv_step_request request;  // its tokens point into the receiver until the next decode
};

class kv_claim_receiver {
 public:
  explicit kv_claim_receiver(const kv_limits& lim) : lim_(lim) {}
  expected<decoded_kv_step> decode(std::span<const uint8_t> bytes);
  uint64_t session() const { return session_; }
  size_t num_known_requests() const { return tokens_.size(); }

 private:
  kv_limits lim_;
  std::unordered_map<uint64_t, std::vector<int32_t>> tokens_;
  uint64_t session_ = 0;
  bool any_ = false;  // a reset was served
};

std::vector<uint8_t> encode_kv_grants(uint64_t session, const kv_step_grants& g);
std::vector<uint8_t> encode_kv_error(uint64_t session, const std::string& why);

}  // namespace troupe::wire
