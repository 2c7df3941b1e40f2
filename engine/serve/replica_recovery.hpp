// replica_recovery: when one replica's scheduler may step, and what it does to get there
// after a loss, without actors. The scheduler actor (actors/scheduler_actor.hpp) tells it
// what happened, with the time, and does what it answers. One thread at a time.
//
//               start, or a loss (a stage or the kv manager gone, a step failed or timed
//               out, the canary failed): plans in flight dropped, running requests recompute
//   +-----------------------------------------------------------------------+
//   v                                                                       |
//   looking_up --all found--> linking --links made--> resetting_kv --> canary --passed--> ready
//     |    ^                                                             |
//     +----+ some missing: looked up again after 25 ms, doubling to 800  +--failed--> (a loss)
//
// Each loss starts an epoch; an answer of an older epoch is stale and changes nothing. The
// first loss since the replica was last ready is looked into at once, later ones after
// 50 ms, doubling to 2 s, so that a stage failing every step does not spin the scheduler.
// Requests that wait longer than the recovery timeout for the replica to be ready end with
// an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace troupe {

using recovery_clock = std::chrono::steady_clock;

enum class recovery_phase : uint8_t { looking_up, linking, resetting_kv, canary, ready };

// What the scheduler does after an event.
struct recovery_step {
  enum class next : uint8_t {
    nothing,      // wait for the next event
    look_up,      // look up the stages and kv manager that are missing, at `at`
    open_links,   // ask for step links and device links
    reset_kv,     // start a new session of the kv manager (none: say kv_reset at once)
    run_canary,   // one token through every stage
  };
  next what = next::nothing;
  recovery_clock::time_point at;  // look_up only: not before this
  uint64_t epoch = 0;             // of the work asked for
  bool drop_in_flight = false;    // a loss: plans in flight are void, running requests recompute
  bool announce = false;          // the replica stopped or started being ready: tell the watchers
};

class replica_recovery {
 public:
  replica_recovery(std::chrono::milliseconds recovery_timeout, recovery_clock::time_point now);

  // -- events ----------------------------------------------------------------------------
  recovery_step start(recovery_clock::time_point now);
  // A loss, with why (health says the latest).
  recovery_step lost(std::string why, recovery_clock::time_point now);
  // The lookups of `epoch` came back: all found, or some still missing.
  recovery_step looked_up(uint64_t epoch, bool all_found, recovery_clock::time_point now);
  // The links of `epoch` are made (or refused: steps then go as actor messages).
  recovery_step links_made(uint64_t epoch);
  // The kv manager of `epoch` is reset.
  recovery_step kv_reset(uint64_t epoch);
  // The canary of `epoch` came back with usable logits: ready.
  recovery_step canary_passed(uint64_t epoch, recovery_clock::time_point now);

  // -- state -----------------------------------------------------------------------------
  uint64_t epoch() const { return epoch_; }
  recovery_phase phase() const { return phase_; }
  bool ready() const { return phase_ == recovery_phase::ready; }
  const std::string& why() const { return why_; }  // the latest reason it is not ready
  // How long the replica was not ready, at the moment it became ready again.
  std::chrono::milliseconds last_outage() const { return last_outage_; }
  // Not ready for the recovery timeout or longer: waiting requests end with this reason.
  std::optional<std::string> overdue(recovery_clock::time_point now, const std::string& replica) const;

 private:
  recovery_step look_up_at(recovery_clock::time_point at);

  std::chrono::milliseconds recovery_timeout_;
  recovery_phase phase_ = recovery_phase::looking_up;
  uint64_t epoch_ = 0;
  int32_t losses_ = 0;         // since the replica was last ready
  int32_t lookup_rounds_ = 0;  // lookups that found something missing, since the last success
  recovery_clock::time_point not_ready_since_;
  std::chrono::milliseconds last_outage_{0};
  std::string why_ = "starting";
};

}  // namespace troupe
