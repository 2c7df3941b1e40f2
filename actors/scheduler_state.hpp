// scheduler_state: the scheduler actor's state and the functions over it, shared by its
// files: scheduler_actor.cpp (messages, results to sinks), scheduler_steps.cpp
// (planning steps with the kv manager and running them through the stages),
// scheduler_drafts.cpp (speculative drafts, here or from the draft actor) and
// scheduler_recovery.cpp (losses, lookups, the canary). Internal to actors/.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <caf/all.hpp>

#include "actors/caf/type_ids.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/step_link.hpp"
#include "actors/wire/client_codec.hpp"
#include "actors/wire/draft_codec.hpp"
#include "actors/wire/kv_codec.hpp"
#include "actors/wire/step_codec.hpp"
#include "engine/kv/kv_tiers.hpp"
#include "engine/serve/replica_recovery.hpp"
#include "engine/serve/step_path.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe::scheduler_actor_impl {

using clock_type = std::chrono::steady_clock;

// The canary's request id: clients' ids never come near it.
constexpr uint64_t canary_id = ~uint64_t{0} - 1;

struct sink_entry {
  caf::actor sink;
  uint32_t seq = 0;
};

// A step sent over a stage's step link, waiting for its answer (answers come in order).
struct link_step {
  clock_type::time_point sent;
  std::function<void(const wire_message&)> then;
};

// A stage's step link (actors/step_link.hpp), for a stage in another process that offers
// one; without a client the stage's steps go as actor messages.
struct stage_link {
  uint64_t id = 0;  // answers name it; those of a closed link are dropped
  std::unique_ptr<step_link_client> client;
  std::deque<link_step> pending;
};

// Step links being dialled, each on a helper actor of its own (a TCP connect and a TLS
// handshake with a hung host take seconds, which the scheduler never waits out): what
// each helper made, kept here until the scheduler takes it, told (link_atom, id).
struct link_dials {
  std::mutex mutex;
  std::unordered_map<uint64_t, expected<std::unique_ptr<step_link_client>>> made;
};

// A dial the scheduler waits for: which session and stage it is for, and what to do once
// it is over (made or not).
struct link_dial {
  uint64_t epoch = 0;
  size_t stage = 0;
  std::function<void()> done;
};

struct scheduler_state {
  static inline const char* name = "troupe.scheduler";

  scheduler_setup setup;
  std::unique_ptr<scheduler> sched;
  wire::step_encoder encoder;
  std::vector<request_id> released;
  std::unordered_map<uint64_t, sink_entry> sinks;
  std::unordered_set<caf::actor_addr> monitored_sinks;
  std::unordered_set<caf::actor_addr> watchers;  // asked for health (the router): told of
                                                 // every change, requests or not
  uint64_t next_id = 1;
  int32_t in_flight = 0;
  caf::actor_clock::time_point last_step_done = {};  // when the latest step came back

  // The kv manager, when the blocks are claimed from one.
  caf::actor kv;                                     // invalid while lost
  std::optional<wire::kv_claim_sender> kv_sender;
  bool planning = false;                             // claims of a step are out
  // Requests whose clients gave up while a step was being planned: ended once it has gone
  // to the stages (end_request). Each with whether its sink is gone.
  std::vector<std::pair<uint64_t, bool>> deferred_ends;

  // The pipeline, and recovery (engine/serve/replica_recovery.hpp: its epoch changes on
  // every loss, and replies of older epochs are dropped).
  std::vector<caf::actor> stages;                    // invalid while lost
  std::vector<stage_link> links;                     // by stage; closed on every loss
  uint64_t next_link_id = 1;
  std::shared_ptr<link_dials> dials = std::make_shared<link_dials>();
  std::unordered_map<uint64_t, link_dial> dialing;  // by link id
  std::unordered_map<std::string, caf::actor> peers; // other nodes' agents, by host:port
  std::unique_ptr<replica_recovery> recovery;
  uint64_t session_base = 0;

  // The step around the pipeline (engine/serve/step_path.hpp): drafts made here
  // (n-gram, trained heads on draft_pool) or ordered from the draft actor (draft, invalid
  // while it is gone), token trees, features, the speculation figures.
  std::unique_ptr<thread_pool> draft_pool;  // (before steps: its heads run on it)
  std::unique_ptr<step_path> steps;
  std::optional<wire::draft_limits> draft_limits;  // set where a draft actor drafts
  caf::actor draft;
  bool finding_draft = false;
  uint64_t draft_sessions = 0;

  // KV tiers that outlive the scheduler, asked about prompts its directory does not cover:
  // as each shard sees them, by its names' prefix.
  std::vector<std::pair<std::string, std::unique_ptr<kv_tiers>>> probes;

  uint64_t epoch() const { return recovery->epoch(); }
  bool ready() const { return recovery->ready(); }
};

using self_ptr = caf::stateful_actor<scheduler_state>*;

inline bool remote_kv(const scheduler_state& st) { return !st.setup.kv_manager.empty(); }
// Whether its drafts come from a draft actor.
inline bool remote_drafts(const scheduler_state& st) { return st.steps->drafts_elsewhere(); }

// scheduler_actor.cpp
void send_result(self_ptr self, uint64_t id, const step_output& out, const std::string& error_text,
                 error_code kind = error_code::invalid);
void dispatch(self_ptr self, std::vector<step_output> outs);
// Ends a request this replica cannot serve: it did not recover in time (unavailable: the
// client may try again later), or the request's own steps keep failing (internal).
void fail_request(self_ptr self, request_id id, const std::string& why, error_code kind = error_code::unavailable);
// Ends a request its client gave up on (cancelled it, or its sink went down): at once, or,
// while a step's claims or drafts are out (planning), once that step has gone to the
// stages. A request must not vanish between its claim and its step: the blocks granted to
// it are in the prefix cache from the claim on (a request of the same step may already
// share them), and only its step computes them. True if the request was there to end.
bool end_request(self_ptr self, uint64_t id, bool sink_gone);
// The requests end_request deferred, ended now (a plan has gone out, or planning stopped).
void end_deferred(self_ptr self);
void announce(self_ptr self);

// scheduler_steps.cpp
void maybe_step(self_ptr self);
void run_from(self_ptr self, uint64_t epoch, size_t i, wire_message plan, wire_message act,
              std::function<void(const wire_message&)> done);
void claim(self_ptr self, const kv_step_request& q, std::function<void(kv_step_grants)> then);
void link_answer(self_ptr self, uint64_t link, const wire_message& out);
void link_failed(self_ptr self, uint64_t link, const std::string& why);

// scheduler_drafts.cpp
// Every request's drafts start afresh (the draft actor is new, or its exchange failed):
// a new session.
void restart_drafts(scheduler_state& st);
// The same, and the KV too (the block ids are given out anew): no tree moves.
void reset_drafts(scheduler_state& st);
// Whether the next step can have drafts (a proposer here, or the draft actor found).
bool can_draft(const scheduler_state& st);
// Looks up the draft actor when it is missing (at most one lookup at a time).
void find_draft(self_ptr self);
// Has the draft actor fill `plan`'s draft slots, then calls `then` with the plan (its
// chunks' tokens and tables its own meanwhile; chunks of requests that ended meanwhile
// dropped). A plan without draft slots, or with the draft actor gone, goes at once
// without drafts. Planning stays on while the order is out.
void with_drafts(self_ptr self, step_plan p, std::function<void(std::shared_ptr<step_plan>)> then);

// Before `plan` goes out: the accepted paths of trees its requests verified join its
// compactions (applied before its chunks). Returns, per chunk, how many of its last rows'
// features the last stage is to return (empty: none; a proposer here reads them).
std::vector<int32_t> ready_plan(scheduler_state& st, step_plan& plan);
// A step's tokens are in, not yet recorded: each tree verified keeps its accepted path
// for its request's next step, and a proposer here sees the features (`wanted`, as
// ready_plan gave them; features: the rows, chunk after chunk).
void after_tokens(scheduler_state& st, const step_plan& plan, const step_tokens& got, std::span<const int32_t> wanted,
                  std::span<const float> features);

// scheduler_recovery.cpp
// Does what recovery asked for after an event.
void follow(self_ptr self, const recovery_step& step);
void lose(self_ptr self, size_t stage, const std::string& why);
void lose_kv(self_ptr self, const std::string& why);
void resolve(self_ptr self);
void check_deadline(self_ptr self);
void check_links(self_ptr self);
// A helper's dial with this link id is over: its link taken into use, if its session is
// still the scheduler's.
void link_dialled(self_ptr self, uint64_t id);

}  // namespace troupe::scheduler_actor_impl
