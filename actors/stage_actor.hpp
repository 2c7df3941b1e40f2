// stage_actor: one pipeline stage: a layer range run by its tensor-parallel shards. It
// fans each step out to its shards, gathers their replies (rank 0's output stands for
// the stage: after the all-reduce every rank holds the same hidden states), and hands the
// step to the next stage, whose reply (in the end, the last stage's logits) answers the
// original request.
//
//   (step_atom, plan, activations) -> logits of the sampled rows
#pragma once

#include <vector>

#include <caf/fwd.hpp>

namespace troupe {

caf::actor spawn_stage(caf::actor_system& sys, std::vector<caf::actor> shards, caf::actor next);

}  // namespace troupe
