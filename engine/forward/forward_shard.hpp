// forward_shard: what a pipeline stage's shard does each step, whatever device runs it:
// a layer range of one tensor-parallel slice over a step_batch.
//
//   hidden: [num_tokens][dim] in host memory, in place: filled from the embedding by the
//           first stage, handed from stage to stage (or, between GPU stages joined by a
//           device link, sent over NCCL: see connect_link).
//   logits: [num_logits][vocab] in host memory, from the last stage's rank 0.
//
// transformer_shard runs on the CPU; cuda_transformer_shard (built with CUDA) on a GPU.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "engine/forward/collective.hpp"
#include "engine/forward/nccl_group.hpp"
#include "engine/forward/step_batch.hpp"
#include "engine/forward/tp_slice.hpp"
#include "engine/model/model.hpp"
#include "engine/util/expected.hpp"
#include "kernels/cpu/sample.hpp"

namespace troupe {

// Which neighbour a device link joins a shard to: the previous stage (whose rank 0 sends
// this stage its input) or the next (to whose ranks this shard, rank 0, sends its output).
enum class link_side { input, output };

// A device link failed during a step (its peer gone, or its group aborted): the link is
// dropped, and the step's hidden states are lost. The shard itself is sound.
struct device_link_broken : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct shard_spec {
  int32_t first_layer = 0;
  int32_t end_layer = 0;  // exclusive; 0 means every layer
  tp_slice tp;
};

class forward_shard {
 public:
  virtual ~forward_shard() = default;
  virtual void forward(const step_batch& batch, float* hidden, float* logits) = 0;
  // forward() with each row's token chosen where the logits are: next[r] gets the token of
  // the r-th logit row forward() would return, chosen as choices[r] says (greedy, or a draw
  // with its truncation and u: kernels/cpu/sample.hpp). A GPU shard chooses on the device
  // and copies back the ids alone. False, with nothing run, for a shard that cannot (the
  // caller runs forward() and chooses itself).
  virtual bool forward_choose(const step_batch& batch, float* hidden, const token_choice* choices, int32_t* next) {
    (void)batch, (void)hidden, (void)choices, (void)next;
    return false;
  }
  // Device links between neighbouring GPU stages (nccl_group.hpp): the previous stage's
  // rank 0 sends its hidden states over NCCL to every rank of the next. connect_link joins
  // this shard to `group` as `rank` (the sender is rank 0, the receiving stage's ranks 1
  // and up) and returns once every rank has connected, or with the reason it could not.
  // With an output link, forward() sends the hidden states there instead of writing
  // `hidden`; after take_next_input_from_link(), the next step takes its input from the
  // input link instead of `hidden` (which still receives an output that goes to the host).
  // A link that fails during a step is dropped, and the step throws device_link_broken.
  virtual status connect_link(link_side side, std::shared_ptr<nccl_group> group, int32_t rank) {
    (void)side, (void)group, (void)rank;
    return error{"only GPU shards have device links"};
  }
  virtual bool has_link(link_side side) const {
    (void)side;
    return false;
  }
  // False, with nothing changed, for a shard without an input link.
  virtual bool take_next_input_from_link() { return false; }
  // Moves a sequence's KV slots now (kv_compaction), as a step's compactions do before its
  // tokens: a token tree's accepted path, moved down to follow the sequence. False, with
  // nothing moved, for a shard that cannot (no trees are verified on it).
  virtual bool compact_kv(const kv_compaction& c) {
    (void)c;
    return false;
  }
  virtual bool is_first_stage() const = 0;
  virtual bool is_last_stage() const = 0;
  virtual const shard_spec& spec() const = 0;
};

}  // namespace troupe
