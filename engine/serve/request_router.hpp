// request_router: the router's decisions, without actors: which replica serves each
// request, the attempt ids the replicas know it by, the chunk numbers its client sees,
// resubmission with the tokens already delivered, cancellation, the wait for a ready
// replica, and every request's one end. actors/router_actor.cpp feeds it events (with the
// time they happened) and carries out the actions it returns. One thread at a time.
//
// A request's life:
//
//   accept --> parked --(a replica is ready: the policy's choice)-------> sent as attempt a
//                ^                                                          |
//                +--- its replica lost: resubmitted with what it delivered -+
//
//   chunk(a)  forwarded as the client's next chunk number (a late chunk of an old
//             attempt is dropped)
//   done(a)   the replica's final result, forwarded as the next chunk number: the end
//   cancel    parked: ended at once; sent: cancelled on the replica, which then ends it
//             (or, if that replica is lost first, ended here as cancelled)
//   parked past wait_timeout: ended as unavailable
//
// Every end is one route_end, produced in one place, once per accepted request.
//
// Roles (disaggregation). Where some replicas prefill and others decode, a request is
// sent to a prefill replica (by the policy, among the prefill replicas) naming the decode
// replica with the fewest requests, coming or there; the prefill replica sends that one
// the prompt's KV, streams the first token and hands the request back (handed_off); the
// router then sends it on to the decode replica with the token delivered and the KV's
// length. A decode replica lost before the handoff: another one, which computes the
// prompt again. A prefill replica lost: another one, or, with none ready, a decode replica
// computes the request whole. Replicas of role both take any request whole.
//
// Policies. least-loaded: the ready replica with the fewest requests. kv-aware: the ready
// replica with the lowest cost, in prompt tokens,
//
//   cost(k) = (prompt - expected_hit(k)) + pending(k) + stream_tokens * active(k)
//             + block_size * short(k)
//
// expected_hit(k): the prompt's leading whole blocks replica k is expected to hold, by the
// prefix summary its scheduler last published and the prompts sent there since (for
// recent_ttl); pending(k): the prompt tokens still to compute of the requests sent there
// that have no token yet; active(k): its requests; short(k): the blocks the request would
// need beyond those its pool last had free (they must be freed first: by requests
// finishing, or by preempting one). A request whose prefix is cached
// somewhere goes there unless that replica's queue costs more than computing the prefix
// again elsewhere; with no prefix anywhere the cost is load alone. Ties: fewer requests,
// then the first replica.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv/prefix_summary.hpp"
#include "engine/util/error_code.hpp"

namespace troupe {

using router_clock = std::chrono::steady_clock;

enum class route_policy : uint8_t { least_loaded, kv_aware };

// What a replica does with requests: all of each (both), or one phase of disaggregated
// serving: prefill (the prompt and the first token; its KV goes to a decode replica) or
// decode (the rest, from the KV sent to it).
enum class replica_role : uint8_t { both, prefill, decode };
std::string_view replica_role_name(replica_role r);

struct route_config {
  route_policy policy = route_policy::least_loaded;
  std::chrono::milliseconds wait_timeout{30000};  // parked at most this long
  double stream_tokens = 64;                      // kv-aware: a request's load beyond its
                                                  // prompt, in prompt tokens
  std::chrono::milliseconds recent_ttl{10000};    // kv-aware: prompts sent to a replica count
                                                  // as cached there this long (its summary
                                                  // may not show them yet)
  uint32_t gateway = 0;                           // which of the deployment's gateways this
                                                  // router serves: its ids are its own
};

// Request ids, unique across a deployment's gateways: the top two bits say whose (0 the
// Cap'n Proto API's, 1 HTTP's, 2 a router's resubmissions, 3 a router's own choice), the
// next 14 which gateway, the rest count.
inline uint64_t request_id_base(uint64_t space, uint32_t gateway) {
  return (space << 62) | (static_cast<uint64_t>(gateway & 0x3fff) << 48);
}

// What kv-aware routing knows of a request's prompt.
struct route_prompt {
  std::vector<uint64_t> chain;  // prefix_chain() of its prompt, in its namespace
  int32_t tokens = 0;           // its prompt's length
  int32_t block_size = 0;       // tokens per block of the chain
  std::vector<int32_t> delivered;  // output its client was given before (by another
                                   // gateway): replayed, never streamed again
};

// Send request `request` to replica `replica` as attempt `attempt` (a first attempt uses
// the client's id; a resubmission carries the tokens delivered so far: delivered()).
struct route_send {
  uint64_t request = 0;
  uint64_t attempt = 0;
  size_t replica = 0;
  bool resubmission = false;
  int32_t kv_to = -1;     // disaggregation: prefill only, its KV for this decode replica
  uint32_t kv_from = 0;   // disaggregation: prompt tokens whose KV a prefill replica sent there
};

// Ask replica `replica` to cancel attempt `attempt`.
struct route_cancel {
  size_t replica = 0;
  uint64_t attempt = 0;
};

enum class route_outcome : uint8_t {
  finished,   // the replica's final result (which may itself report an error)
  cancelled,  // the client cancelled
  failed,     // ended here: `code` and `why` say how
};

// The end of a request, said to its client once: the final message carries chunk number
// `seq`. The rest is for the request's log line.
struct route_end {
  uint64_t request = 0;
  route_outcome outcome = route_outcome::finished;
  error_code code = error_code::internal;  // failed only
  std::string why;                         // failed only
  uint32_t seq = 0;
  uint32_t delivered_tokens = 0;
  int32_t replica = -1;                    // the last one it was sent to
  uint32_t resubmits = 0;
  double ttft_ms = -1;                     // -1: no token yet
  double e2e_ms = 0;
};

struct route_actions {
  std::vector<route_send> sends;
  std::vector<route_cancel> cancels;
  std::vector<route_end> ends;
  bool empty() const { return sends.empty() && cancels.empty() && ends.empty(); }
};

// A chunk of an attempt, as the client numbers it.
struct route_chunk {
  uint64_t request = 0;
  uint32_t seq = 0;
};

class request_router {
 public:
  // First attempts use the client's id; resubmissions take ids from 2^63 up, which no
  // gateway hands out.
  static constexpr uint64_t first_resubmission_id = uint64_t{2} << 62;

  request_router(size_t num_replicas, const route_config& cfg);
  request_router(size_t num_replicas, std::chrono::milliseconds wait_timeout)
      : request_router(num_replicas, route_config{.wait_timeout = wait_timeout}) {}

  // -- requests --------------------------------------------------------------------------
  // A new request: sent to a replica, parked, or (its id in use) ended as invalid. Its
  // prompt (chain and length) steers kv-aware routing; without one, the cost is load.
  route_actions accept(uint64_t id, router_clock::time_point now, route_prompt prompt = {});
  // Whether `id` is a request here; what cancelling it takes.
  bool cancel(uint64_t id, router_clock::time_point now, route_actions& out);
  // A chunk of attempt `attempt` with these tokens: how its client numbers it, or nothing
  // (an attempt given up: a late chunk of a lost replica).
  std::optional<route_chunk> chunk(uint64_t attempt, std::span<const int32_t> tokens, router_clock::time_point now);
  // The final result of attempt `attempt`, whose last chunk holds `last_tokens`: the end to
  // forward, or nothing (an attempt given up).
  std::optional<route_end> done(uint64_t attempt, std::span<const int32_t> last_tokens, router_clock::time_point now);
  // Attempt `attempt` was refused by its replica before any token (SLO admission: that
  // replica cannot serve it in time): it goes to a ready replica that has not refused it,
  // or, when none is left, ends as unavailable with `why`. Nothing: an attempt given up.
  route_actions refused(uint64_t attempt, std::string why, router_clock::time_point now);
  uint64_t redirected() const { return redirected_; }  // refused requests sent elsewhere
  // A prefill replica handed attempt `attempt` over (its first token came as a chunk),
  // having sent the KV of `kv_sent` prompt tokens to the decode replica it was named:
  // sent there, or parked. Nothing: an attempt given up.
  route_actions handed_off(uint64_t attempt, uint32_t kv_sent, router_clock::time_point now);
  uint64_t handoffs() const { return handoffs_; }
  // A request the actor cannot carry on (its resubmission could not be built, or the final
  // result could not be forwarded): ended as failed.
  std::optional<route_end> fail(uint64_t id, error_code code, std::string why, router_clock::time_point now);
  // Parked requests go where they can; those parked past the wait timeout end.
  route_actions tick(router_clock::time_point now);

  // The output the client has received, for a resubmission's frame.
  const std::vector<int32_t>& delivered(uint64_t id) const;
  size_t num_requests() const { return requests_.size(); }
  bool has_request(uint64_t id) const { return requests_.count(id) != 0; }

  // -- replicas --------------------------------------------------------------------------
  // Its scheduler was found (or found again): requests may go there once it is ready.
  void replica_found(size_t k);
  // Its scheduler says whether it is ready (and why not); a replica becoming ready takes
  // parked requests.
  route_actions replica_health(size_t k, bool ready, std::string detail, router_clock::time_point now);
  // Its scheduler is gone: every request there is resubmitted (or, cancelled, ended).
  route_actions replica_lost(size_t k, std::string why, router_clock::time_point now);
  // Why a replica is not found yet, for health.
  void replica_detail(size_t k, std::string detail) { replicas_[k].detail = std::move(detail); }
  // What its scheduler says its prefix cache holds now (kv-aware routing).
  void replica_summary(size_t k, prefix_summary s) { replicas_[k].summary = std::move(s); }
  // The blocks its pool has free, as its scheduler last said (-1: not known).
  void replica_free_blocks(size_t k, int64_t free) { replicas_[k].free_blocks = free; }
  // Its role (all start as both).
  void set_role(size_t k, replica_role role) { replicas_[k].role = role; }
  // Some replicas prefill (and others decode): requests go in two phases.
  bool disaggregated() const;

  struct replica_view {
    bool found = false, ready = false;
    size_t active = 0;           // requests sent there and not ended
    int64_t pending_tokens = 0;  // prompt tokens to compute of those with no token yet
    int64_t free_blocks = -1;    // its pool's free blocks, as last said (-1: not known)
    std::string detail;
    std::optional<prefix_summary> summary;  // as its scheduler last said (kv-aware)
    replica_role role = replica_role::both;
    size_t incoming = 0;         // a decode replica's requests in prefill elsewhere
    router_clock::time_point ready_since{};  // when it last became ready
    bool down_before = false;    // it has had an outage (counted)
  };
  const replica_view& replica(size_t k) const { return replicas_[k]; }
  size_t num_replicas() const { return replicas_.size(); }
  uint32_t num_ready() const;
  // Whether a request can be served to its end now: a ready replica that decodes (a prefill
  // replica alone cannot finish one).
  bool can_serve() const;
  // "replica NAME: why" for each replica that is not ready, names from `names`.
  std::string not_ready_detail(std::span<const std::string> names) const;

  uint64_t failovers() const { return failovers_; }      // replica schedulers lost
  uint64_t resubmitted() const { return resubmitted_; }  // requests moved to another attempt
  // Times a replica stopped being ready, each outage once: a replica that fails again
  // within outage_settle of coming back (recovering by steps, a stage rejoining) is still
  // in the same outage. Counted since this router started.
  uint64_t outages() const { return outages_; }
  // When a replica last stopped being ready (found not ready, or lost), outage or not.
  std::optional<router_clock::time_point> last_down() const { return last_down_; }
  static constexpr std::chrono::seconds outage_settle{10};
  // kv-aware routing: sends to a replica expected to hold part of the prompt, and the
  // prompt tokens it was expected to hold.
  uint64_t prefix_routed() const { return prefix_routed_; }
  uint64_t expected_hit_tokens() const { return expected_hit_tokens_; }
  const route_config& config() const { return cfg_; }

 private:
  struct routed {
    std::vector<int32_t> delivered;
    uint32_t seq = 0;        // the client's next chunk number
    uint64_t attempt = 0;    // 0: parked
    int32_t replica = -1;
    uint32_t resubmits = 0;
    bool cancelled = false;  // never resubmitted
    router_clock::time_point arrived, parked_since;
    double ttft_ms = -1;
    route_prompt prompt;
    int64_t pending = 0;     // counted in its replica's pending_tokens until its first token
    std::vector<bool> refused_by;  // replicas whose SLO admission refused it
    int32_t decode_to = -1;  // disaggregation: the decode replica its KV goes to (counted in
                             // its incoming while prefilling), then the one holding it
    uint32_t kv_sent = 0;    // prompt tokens whose KV landed at decode_to
    bool prefilling = false; // its attempt is a prefill replica's (kv_to)
  };
  // Prompts sent to a replica lately, by block hash (kv-aware), oldest first.
  struct recent_blocks {
    std::unordered_map<uint64_t, router_clock::time_point> at;
    std::deque<std::pair<uint64_t, router_clock::time_point>> order;
  };
  static constexpr size_t max_recent_blocks = size_t{1} << 16;

  void send_or_park(uint64_t id, routed& r, route_actions& out, router_clock::time_point now);
  // The replica request `r` goes to (-1: none is ready), and the blocks it expects there.
  int32_t choose(const routed& r, router_clock::time_point now, size_t& hit_blocks);
  // Among the ready replicas of a role (`prefill`: prefill replicas; otherwise those that
  // decode: decode and both) that have not refused r.
  int32_t choose_among(const routed& r, bool prefill, router_clock::time_point now, size_t& hit_blocks);
  int32_t least_loaded_decoder() const;
  void drop_decode_target(routed& r);
  size_t expected_blocks(size_t k, const route_prompt& p, router_clock::time_point now);
  void remember(size_t k, const route_prompt& p, router_clock::time_point now);
  void settle_pending(routed& r);
  route_end end(uint64_t id, route_outcome outcome, error_code code, std::string why, router_clock::time_point now);
  void unpark(router_clock::time_point now, route_actions& out);
  void set_ready(replica_view& rep, bool ready, router_clock::time_point now);

  route_config cfg_;
  std::vector<replica_view> replicas_;
  std::vector<recent_blocks> recent_;
  std::unordered_map<uint64_t, routed> requests_;   // by the client's id
  std::unordered_map<uint64_t, uint64_t> attempts_; // attempt -> client id
  std::deque<uint64_t> parked_;
  uint64_t next_attempt_;  // from first_resubmission_id, in this gateway's part
  uint64_t failovers_ = 0, resubmitted_ = 0, outages_ = 0;
  std::optional<router_clock::time_point> last_down_;
  uint64_t prefix_routed_ = 0, expected_hit_tokens_ = 0, redirected_ = 0, handoffs_ = 0;
};

}  // namespace troupe
