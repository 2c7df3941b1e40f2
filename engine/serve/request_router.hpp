// request_router: the router's decisions, without actors: which replica serves each
// request, the attempt ids the replicas know it by, the chunk numbers its client sees,
// resubmission with the tokens already delivered, cancellation, the wait for a ready
// replica, and every request's one end. actors/router_actor.cpp feeds it events (with the
// time they happened) and carries out the actions it returns. One thread at a time.
//
// A request's life:
//
//   accept --> parked --(a replica is ready: the fewest requests wins)--> sent as attempt a
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
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/util/error_code.hpp"

namespace troupe {

using router_clock = std::chrono::steady_clock;

// Send request `request` to replica `replica` as attempt `attempt` (a first attempt uses
// the client's id; a resubmission carries the tokens delivered so far: delivered()).
struct route_send {
  uint64_t request = 0;
  uint64_t attempt = 0;
  size_t replica = 0;
  bool resubmission = false;
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

  request_router(size_t num_replicas, std::chrono::milliseconds wait_timeout);

  // -- requests --------------------------------------------------------------------------
  // A new request: sent to a replica, parked, or (its id in use) ended as invalid.
  route_actions accept(uint64_t id, router_clock::time_point now);
  // Whether `id` is a request here; what cancelling it takes.
  bool cancel(uint64_t id, router_clock::time_point now, route_actions& out);
  // A chunk of attempt `attempt` with these tokens: how its client numbers it, or nothing
  // (an attempt given up: a late chunk of a lost replica).
  std::optional<route_chunk> chunk(uint64_t attempt, std::span<const int32_t> tokens, router_clock::time_point now);
  // The final result of attempt `attempt`, whose last chunk holds `last_tokens`: the end to
  // forward, or nothing (an attempt given up).
  std::optional<route_end> done(uint64_t attempt, std::span<const int32_t> last_tokens, router_clock::time_point now);
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

  struct replica_view {
    bool found = false, ready = false;
    size_t active = 0;  // requests sent there and not ended
    std::string detail;
  };
  const replica_view& replica(size_t k) const { return replicas_[k]; }
  size_t num_replicas() const { return replicas_.size(); }
  uint32_t num_ready() const;
  // "replica NAME: why" for each replica that is not ready, names from `names`.
  std::string not_ready_detail(std::span<const std::string> names) const;

  uint64_t failovers() const { return failovers_; }      // replica schedulers lost
  uint64_t resubmitted() const { return resubmitted_; }  // requests moved to another attempt
  uint64_t outages() const { return outages_; }          // times a replica stopped being ready

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
  };

  void send_or_park(uint64_t id, routed& r, route_actions& out);
  route_end end(uint64_t id, route_outcome outcome, error_code code, std::string why, router_clock::time_point now);
  void unpark(router_clock::time_point now, route_actions& out);
  void set_ready(replica_view& rep, bool ready);

  std::chrono::milliseconds wait_timeout_;
  std::vector<replica_view> replicas_;
  std::unordered_map<uint64_t, routed> requests_;   // by the client's id
  std::unordered_map<uint64_t, uint64_t> attempts_; // attempt -> client id
  std::deque<uint64_t> parked_;
  uint64_t next_attempt_ = first_resubmission_id;
  uint64_t failovers_ = 0, resubmitted_ = 0, outages_ = 0;
};

}  // namespace troupe
