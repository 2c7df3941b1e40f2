// scheduler_actor: the step loop of one replica as an actor. Its state owns the engine's
// scheduler and the requests' samplers; each step's plan goes to the replica's first
// stage, the logits that come back are sampled here, and each request's news is sent to
// the sink that asked for it.
//
//   (generate_atom, GenerateRequest frame, sink) -> request id (uint64)
//   (generate_atom, id, GenerateRequest frame, sink) -> ()   the caller chose the id; a
//                                                 refused request ends at once with an
//                                                 error result sent to the sink
//   (cancel_atom, id)                            -> found (bool)
//   (stats_atom)                                 -> (kv used, kv free, running, waiting)
//
// A sink receives (chunk_atom, TokenChunk frame) for every step that gave its request
// tokens or text, chunks numbered from 0 without gaps, then (done_atom, GenerateResult
// frame) once. Up to max_in_flight steps are in flight at once (one per pipeline stage
// keeps every stage busy), each over different requests; a single step in flight is also
// the flow control of the activations between stages.
#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "engine/model/model.hpp"
#include "engine/sched/scheduler.hpp"

namespace troupe {

struct scheduler_setup {
  const model* m = nullptr;
  const tokenizer* tok = nullptr;
  scheduler_config config;
  caf::actor entry;  // the replica's first stage
  int32_t max_in_flight = 1;  // the number of pipeline stages is a good value
};

caf::actor spawn_scheduler(caf::actor_system& sys, const scheduler_setup& setup);

}  // namespace troupe
