// step_choices: who chooses a step's tokens, and how a sampled chunk's rows become tokens.
// One rule, for the engine loop (llm_engine) and the scheduler actor alike:
//
// - When every sampled row's choice needs only its logits (greedy, or a plain draw: no
//   penalties, biases or log-probabilities), the shard that holds the logits (the last
//   stage; on a GPU, the device) chooses each token, with the uniform its request's
//   sampler would draw next (sampler::next_choice), and only the ids come back. Each
//   sampler then replays its token, drawing that uniform, so a step that is lost and
//   computed again draws the same.
// - A chunk with drafts (speculative decoding) has a row for its known token and one per
//   draft. Greedy, the shard takes each row's argmax and the drafts are verified from the
//   ids alone; random sampling needs each row's distribution, so its logits come back.
// - Otherwise the logits come back, and each request's sampler chooses from its row, or
//   verifies its drafts (sampler::verify).
//
// A request that ended while its step ran (cancelled) still has its rows; nothing records
// its token.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/sched/scheduler.hpp"
#include "engine/speculative/speculative.hpp"
#include "kernels/cpu/sample.hpp"

namespace troupe {

// What speculation gave in one step.
struct spec_tally {
  uint64_t verifies = 0;  // chunks that verified drafts
  uint64_t proposed = 0;  // drafts verified
  uint64_t accepted = 0;  // of which accepted
  std::array<uint64_t, max_draft_tokens + 1> by_accepted{};  // verifies by drafts accepted
  // By depth d (index d - 1): verifies whose drafts reached depth d (a chain's d-th draft,
  // a tree's nodes d levels down), and those that kept a draft there. With Medusa, depth d
  // is head d's guess.
  std::array<uint64_t, max_draft_tokens> offered_at{}, kept_at{};

  spec_tally& operator+=(const spec_tally& o) {
    verifies += o.verifies;
    proposed += o.proposed;
    accepted += o.accepted;
    for (size_t i = 0; i < by_accepted.size(); ++i) by_accepted[i] += o.by_accepted[i];
    for (size_t i = 0; i < offered_at.size(); ++i) {
      offered_at[i] += o.offered_at[i];
      kept_at[i] += o.kept_at[i];
    }
    return *this;
  }
};

// A step's tokens: the samples for scheduler::update_from_output, how many each sampled
// chunk emitted (1, or with drafts 1 to drafts + 1), and the speculation figures.
struct step_tokens {
  std::vector<sample_result> samples;
  std::vector<int32_t> emitted;
  std::vector<std::vector<int32_t>> paths;  // per sampled chunk, a token tree's accepted
                                            // drafts (indices); empty for chains (and
                                            // shorter than emitted when trailing ones are)
  spec_tally spec;
};

// The choices of the plan's logit rows, in order (a chunk with drafts: one per row); empty
// when the logits must come back.
std::vector<token_choice> shard_choices(const step_plan& plan, scheduler& sched);

// The same per chunk of the plan (nullopt for chunks without a row; a chunk with drafts
// has one greedy choice for all its rows), as a step plan on the wire carries them; all
// nullopt when the logits must come back.
std::vector<std::optional<token_choice>> shard_choices_by_chunk(const step_plan& plan, scheduler& sched);

// Tokens the shard chose, one per logit row: each sampler replays its own, and a chunk
// with drafts keeps them while they equal the row's argmax, then the argmax.
step_tokens replay_chosen(const step_plan& plan, scheduler& sched, std::span<const int32_t> chosen,
                          const speculative_config& spec);

// Tokens chosen here, from logit rows [row][vocab] (penalties and biases applied in
// place): each request's sampler samples its row, or verifies its drafts.
step_tokens sample_rows(const step_plan& plan, scheduler& sched, float* logits, int32_t vocab,
                        const speculative_config& spec);

}  // namespace troupe
