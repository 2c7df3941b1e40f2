// Speculative decoding: a cheap proposer guesses the next tokens of a request, and the
// target checks all of them in one forward pass (sampler::verify), which costs about as
// much as one token where decode reads its weights from memory. Output is exactly the
// target's: token for token when greedy, in distribution when sampling.
//
// A step with speculation (llm_engine::step):
//   1. plan_drafts() gives each decoding request its draft slots: its own adaptive length,
//      within what the step may grow to (speculation turns down as the batch grows);
//   2. the scheduler claims KV blocks for them (never cached; rejected ones roll back);
//   3. the proposer fills the slots it can (proposer::propose);
//   4. the target computes every known and drafted token and verifies each request's run.
//
// Proposers: n-gram lookup in the request's own tokens (ngram_proposer.hpp), a draft
// model, and the target's first layers by early exit (model_proposer.hpp), and trained
// heads on the target's features: Medusa (medusa_proposer.hpp) and EAGLE
// (eagle_proposer.hpp), which see the features each step computed (observe_features).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/model.hpp"
#include "engine/sched/request.hpp"
#include "engine/sched/scheduler.hpp"

namespace troupe {

enum class spec_method : uint8_t { none, ngram, draft, early_exit, medusa, eagle };

// "ngram", "draft", "early-exit", "medusa", "eagle", "none"
std::string_view spec_method_name(spec_method m);
std::optional<spec_method> parse_spec_method(std::string_view s);

struct speculative_config {
  spec_method method = spec_method::none;
  int32_t k = 3;                 // drafts per step at most (1 .. max_draft_tokens)
  int32_t exit_layer = 0;        // early exit: the target's layers the draft runs (0: a
                                 // quarter of them, at least one)
  int32_t ngram_min = 1;         // n-gram: suffix lengths matched, longest first
  int32_t ngram_max = 4;
  int32_t max_step_tokens = 8;   // speculation adapts to the batch: drafts are handed out
                                 // while a step's decode tokens and drafts stay within this
                                 // many (at 8 requests decoding, none)
  // A token tree instead of a chain of k drafts: tree[d] candidates at depth d + 1 under
  // every node of depth d (the proposer's top ones for that position, along its most
  // likely path), all verified in one pass. Empty: a chain.
  std::vector<int32_t> tree;
  int32_t tree_auto = 0;  // > 0: the tree's shape is chosen from the acceptance measured so
                          // far (tree_shape.hpp), within this many nodes; tree: the first

  bool enabled() const { return method != spec_method::none; }
  // A tree's nodes (its root, the sequence's end, not counted).
  int32_t tree_nodes() const;
  // What each step drafts, for operators: "k 3", "tree 4,2,2 (28 nodes)", "a tree chosen
  // by acceptance, 15 nodes at most".
  std::string drafts_text() const;
  // Trained heads (a head file) propose: Medusa or EAGLE.
  bool uses_heads() const { return method == spec_method::medusa || method == spec_method::eagle; }
  // The exit layer early exit runs with, for a target of num_layers layers.
  int32_t exit_layer_for(int32_t num_layers) const {
    return exit_layer > 0 ? exit_layer : std::max(1, num_layers / 4);
  }
};

// Checks the configuration against the target; the first problem in words.
std::optional<std::string> validate(const speculative_config& c, const model_config& target);
// Checks a draft model against the target: the same vocabulary (size and, where both
// files carry one, every token's text).
std::optional<std::string> check_draft(const model& draft, const model& target);

struct speculative_heads;
// Checks a head file against the configuration: its kind is the method's, and Medusa's
// heads reach k drafts.
std::optional<std::string> check_heads(const speculative_config& c, const speculative_heads& h);

// One request's draft slots in a step, for a proposer to fill.
struct draft_slot {
  request* req = nullptr;
  int32_t max_tokens = 0;        // slots granted
  std::vector<int32_t> tokens;   // proposed, at most max_tokens (fewer, or none, is fine)
  std::vector<float> q;          // [tokens.size()][vocab]: the distribution each was drawn
                                 // from, when drawn at random; empty: chosen as certain
  std::span<const float> uniforms;  // random drafts: the uniform each slot's draw uses (a
                                    // proposer elsewhere gets them with the order); empty:
                                    // drawn from the request's draft stream
  // A token tree (speculative_config::tree): the widths wanted; the proposer fills levels
  // (each position's candidates, most likely first, along its most likely path, which
  // `tokens` holds), and take_drafts makes the tree: tokens, then parents.
  std::span<const int32_t> tree = {};
  std::vector<std::vector<int32_t>> levels = {};
  std::vector<int32_t> parents = {};
  // KV eviction (engine/kv/kv_eviction.hpp): the sequence position each slot of the
  // request's cache holds, for the slots its computed tokens take (ascending; the last is
  // the last computed token's, the tokens after it take the slots after), and whether
  // RoPE positions are slots. Empty: slot i holds position i.
  std::span<const int32_t> slot_positions = {};
  bool rope_in_cache = false;
};

class proposer {
 public:
  virtual ~proposer() = default;
  virtual void propose(std::span<draft_slot> slots) = 0;
  // Proposers that draft from the target's features: after each step, the features (the
  // last layer's output, before the final norm; [n][dim]) of request `id`'s tokens at
  // positions first .. first + n - 1, which the step computed and the request now holds.
  virtual bool wants_features() const { return false; }
  // Whether it drafts over the target's own KV cache (early exit beside the target's
  // shard): the step's compactions must then be made before it drafts.
  virtual bool shares_target_kv() const { return false; }
  // KV eviction: request `id`'s cache was compacted (kv_compaction: slot kept[i] moved to
  // slot i); a proposer with a cache of its own in the request's blocks moves it the same
  // way, before it next drafts for the request.
  virtual void compacted(request_id id, const kv_compaction& c) { (void)id, (void)c; }
  // Whether it keeps a feature for every position (EAGLE), or reads only the last one a
  // step leaves each request (Medusa): a pipeline returns only those.
  virtual bool wants_every_feature() const { return false; }
  virtual void observe(request_id id, int32_t first, const float* features, int32_t n) {
    (void)id, (void)first, (void)features, (void)n;
  }
  // The request's KV is gone (finished, preempted): what the proposer kept for it too.
  virtual void forget(request_id id) { (void)id; }
  virtual void forget_all() {}
};

// A token tree's nodes in breadth-first order from per-position candidates: levels[d]'s
// first widths[d] under every node of depth d (fewer where a level has fewer); tokens and
// parents (-1: under the sequence's end), at most max_nodes of them.
void build_tree(std::span<const std::vector<int32_t>> levels, std::span<const int32_t> widths, int32_t max_nodes,
                std::vector<int32_t>& tokens, std::vector<int32_t>& parents);

// What a proposer does with a drafted position's logits: in a chain, choose_draft; in a
// tree, the position's candidates (sampler::ranked, s.tree's width) go to s.levels and the
// first continues the path (tokens; view advanced over it).
void draft_next(draft_slot& s, sampler& view, float* logits, int32_t vocab, std::vector<float>& scratch);

// Appends to `s` the draft its request's sampler would choose from `logits` (penalties
// and biases, over the sequence and s's drafts so far, as `view` has them; view is then
// advanced over it): greedy, the argmax; sampling, a draw with the request's draft stream,
// and its distribution kept in s.q for verification. `scratch` holds a greedy one.
void choose_draft(draft_slot& s, sampler& view, float* logits, int32_t vocab, std::vector<float>& scratch);

// After a step: hands p (when it wants them) the features of every chunk's tokens that its
// request now holds: all its known tokens; of a verified chunk's drafts, the accepted ones
// (emitted: per sampled chunk, as step_tokens has it; requests still running only).
// hidden: [tokens of the step][dim].
// A tree's chunk: its root and accepted path (paths, per sampled chunk: the accepted
// drafts' indices; empty for a chain).
void observe_features(const step_plan& plan, scheduler& sched, std::span<const int32_t> emitted,
                      std::span<const std::vector<int32_t>> paths, const float* hidden, int32_t dim, proposer& p);

// How many of a chunk's last rows observe_features hands p, when p wants features at all:
// every row where p keeps one per position, else the chunk's last known token's and its
// drafts' (the last one its request holds is among them).
inline int32_t feature_rows(const scheduled_chunk& c, const proposer& p) {
  return p.wants_every_feature() ? c.count : 1 + c.num_draft;
}

// The most drafts a request takes per step: k, or its own cap when lower.
inline int32_t draft_cap(const request& r, const speculative_config& c) {
  return r.params.speculative < 0 ? c.k : std::min(r.params.speculative, c.k);
}

// The adaptive draft length after a verify of `proposed` drafts, `accepted` of them taken:
// one more after a full acceptance, else one past what was accepted; within 1 .. cap.
int32_t next_draft_length(int32_t current, int32_t proposed, int32_t accepted, int32_t cap);

// What a request learns from a verify: its next draft length, and, when even single
// drafts keep being rejected (where a draft costs more than it returns), a pause without
// drafts: 4 decode steps after the second such miss in a row, doubling with each further
// one up to 64; any acceptance ends the streak. A token tree that kept nothing leaves its
// request a single draft a step (plan_drafts) until one is kept.
void after_verify(request& r, int32_t proposed, int32_t accepted, const speculative_config& c);

// Draft slots for the running requests that decode next (in scheduling order): each its
// adaptive length, capped by its own limit, by what max_tokens and the context leave, and
// by the step's share: decode tokens and drafts together within max_step_tokens.
// Sets request::drafts.wanted on each.
void plan_drafts(std::span<request* const> running, const speculative_config& c, int32_t context);

// Step 3: fills the draft slots of `plan` (made after plan_drafts) with p's proposals; a
// chunk whose proposer came up short computes fewer positions. Each request keeps its
// drafts (request::drafts: tokens, q) for verification, and its chunk's draft points at
// them. slots: scratch, kept by the caller between steps.
// With `tree` (speculative_config::tree), each slot's candidates make a token tree.
void fill_drafts(step_plan& plan, scheduler& sched, proposer& p, std::vector<draft_slot>& slots,
                 std::span<const int32_t> tree = {});

// The second half of fill_drafts, for drafts from anywhere: slots holds one entry per chunk
// of `plan` with draft slots, in order, each with its proposals (a slot without a request,
// one that ended meanwhile, has none). A chunk keeps what its slot proposed and computes no
// more positions than that.
void take_drafts(step_plan& plan, std::span<draft_slot> slots);

}  // namespace troupe
