// step_choices: who chooses a step's tokens. One rule, for the engine loop (llm_engine)
// and the scheduler actor alike:
//
// - When every sampled row's choice needs only its logits (greedy, or a plain draw: no
//   penalties, biases or log-probabilities), the shard that holds the logits (the last
//   stage; on a GPU, the device) chooses each token, with the uniform its request's
//   sampler would draw next (sampler::next_choice), and only the ids come back. Each
//   sampler then replays its token, drawing that uniform, so a step that is lost and
//   computed again draws the same.
// - Otherwise the logits come back, and each request's sampler chooses from its row.
//
// A request that ended while its step ran (cancelled) still has its row; nothing records
// its token.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/sched/scheduler.hpp"
#include "kernels/cpu/sample.hpp"

namespace troupe {

// The choices of the plan's sampled rows, in order; empty when the logits must come back.
std::vector<token_choice> shard_choices(const step_plan& plan, scheduler& sched);

// The same per chunk of the plan (nullopt for chunks without a row), as a step plan on
// the wire carries them; all nullopt when the logits must come back.
std::vector<std::optional<token_choice>> shard_choices_by_chunk(const step_plan& plan, scheduler& sched);

// Tokens the shard chose, one per sampled row: each sampler replays its own. The samples
// for scheduler::update_from_output.
std::vector<sample_result> replay_chosen(const step_plan& plan, scheduler& sched, std::span<const int32_t> chosen);

// Tokens chosen here, each request's sampler from its row of logits [row][vocab]
// (penalties and biases applied in place). The samples for update_from_output.
std::vector<sample_result> sample_rows(const step_plan& plan, scheduler& sched, float* logits, int32_t vocab);

}  // namespace troupe
