// scheduler_actor: the step loop of one replica as an actor. Its state owns the engine's
// scheduler and the requests' samplers. Each step's plan goes to stage 0, whose output the
// scheduler hands to stage 1, and so on; the last stage chooses the tokens of rows that
// need only their logits (the plan carries each one's truncation and uniform), or returns
// the logits for the samplers here; each request's news goes to the sink that asked for it.
//
//   (generate_atom, GenerateRequest frame, sink) -> request id (uint64)
//   (generate_atom, id, GenerateRequest frame, sink) -> ()   the caller chose the id; a
//                                                 refused request ends at once with an
//                                                 error result sent to the sink
//   (cancel_atom, id)                            -> found (bool)
//   (stats_atom)                                 -> (kv used, kv free, running, waiting)
//   (health_atom)                                -> (ready, kv used, kv free, running,
//                                                    waiting, detail)
//   (metrics_atom)                               -> scheduler_figures: its prefix
//                                                    cache, speculative decoding, KV
//                                                    eviction and KV tiers
//                                                    (actors/scheduler_figures.hpp)
//   (prefix_atom)                                -> its prefix cache's summary as words
//                                                    (engine/kv/prefix_summary.hpp; empty
//                                                    while not ready), for kv-aware routing
//
// Speculative decoding (setup.spec): before each plan the scheduler gives decoding
// requests draft slots (plan_drafts) and claims their blocks with the step's. It fills
// them with n-gram drafts itself, or has its draft actor fill them (one exchange per step,
// engine/speculative/draft_exchange.hpp), and sends the drafts as tokens of the step; the last
// stage returns a row per draft (its argmax where step_choices.hpp allows, else its
// logits), and each request's sampler verifies here. Blocks that only rejected drafts used
// go back with the request's next claim (the kv manager's grant drops them). The draft
// actor is looked up by name and watched; while it is gone (or after an exchange fails)
// steps go without drafts, the replica stays ready, and it is looked up again every tick.
//
// A sink receives (chunk_atom, TokenChunk frame) for every step that gave its request
// tokens or text, chunks numbered from 0 without gaps, and at the end one
// (done_atom, GenerateResult frame) that carries the final chunk inside it (hasLast), so
// a request's end is a single message. Up to max_in_flight steps are in flight at once
// (one per pipeline stage keeps every stage busy), each over different requests.
//
// KV blocks: with a kv manager named in the setup (the runtime's layout), each step's
// blocks are claimed from it in one exchange before the plan goes to stage 0 (usually
// one round; more when blocks run short and a request is preempted); blocks released
// when no step follows are handed back at once. Without one (tests, one-process tools),
// the scheduler keeps its blocks itself.
//
// KV tiers (config.kv.tiers): plans carry the blocks the shards load before the step and
// copy down after it (engine/sched/scheduler.hpp); the requests whose loads failed come
// back with the step's output, and are computed again before anything of theirs is
// sampled.
//
// Failures: the scheduler finds its stages (and its kv manager) by name through node
// agents (its own, or one published at another node's port) and monitors them. When a
// stage dies, or a step fails or times out, the plans in flight are dropped, every
// running request goes back to waiting with its tokens (its KV recomputed later: the
// stages' caches are forgotten), and the stages are looked up again with a backoff (a
// stage that fails every step is retried after a pause growing to 2 s). Losing the kv
// manager (it dies, refuses the claims of a session it never served, or answers
// nonsense) is the same kind of loss: the blocks it tracked are forgotten. The replica is
// ready again only after the kv manager is reset and a canary step through every stage
// succeeds. Requests that wait longer than recovery_timeout for that end with an error. A
// sink that dies (its node gone) has its requests aborted.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "engine/model/model.hpp"
#include "engine/sched/scheduler.hpp"
#include "engine/speculative/speculative.hpp"

namespace troupe {

// Where a stage is found: through the local agent when port is 0, else through the agent
// published at host:port.
struct stage_address {
  std::string name;
  std::string host;
  uint16_t port = 0;
};

struct scheduler_setup {
  const model* m = nullptr;
  const tokenizer* tok = nullptr;
  scheduler_config config;
  std::string replica = "r0";
  std::vector<stage_address> stages;
  std::string kv_manager;     // its name on this node's agent; empty: the scheduler keeps
                              // its blocks itself
  caf::actor agent;           // this node's agent (local stage lookups)
  int32_t max_in_flight = 1;  // the number of pipeline stages is a good value
  std::chrono::milliseconds step_timeout{60000};
  std::chrono::milliseconds recovery_timeout{30000};
  // Speculative decoding: n-gram drafts are made here; a draft model's, or early exit's
  // (the model's first layers), come from the replica's draft actor (actors/draft_actor.hpp),
  // found by name like a stage. Verify steps go through the stages like any step.
  // Medusa and EAGLE heads (spec.method medusa, eagle) draft here too, from the features
  // of the last layer that the last stage returns with each step's logits or tokens. With
  // a token tree (spec.tree), each verified tree's accepted path moves down in the
  // stages' KV with its request's next step (a compaction).
  speculative_config spec;
  std::shared_ptr<const speculative_heads> heads;  // for medusa and eagle, loaded
  stage_address draft;  // the draft actor, for spec.method draft and early-exit
  // KV tiers (config.kv.tiers): the ones that outlive this scheduler and that it can reach
  // (Redis; a directory on this node when every stage is here too), and each shard's
  // names in them (engine/forward/shard_tiers.hpp): a prompt the scheduler's directory
  // does not cover is looked up there, as far as every shard holds its blocks.
  std::vector<tier_config> probe_tiers;
  std::vector<std::string> tier_prefixes;
};

caf::actor spawn_scheduler(caf::actor_system& sys, const scheduler_setup& setup);

}  // namespace troupe
