// draft_exchange: speculative drafts from a proposer elsewhere: the draft actor of a
// replica (actors/draft_actor.hpp), which runs a draft model or the target's first layers
// beside the pipeline. Each step with draft slots, the scheduler sends one order and waits
// for its answer before the plan goes to the first stage.
//
//   draft_orders (the scheduler's side) makes the order from a plan: per chunk with draft
//     slots, the request's tokens the other side has not seen yet (the whole sequence the
//     first time, then what was added), its block table, its sampler's settings the first
//     time, and the uniforms its random drafts use, drawn from the request's draft stream
//     as a local proposer draws them, so that a seeded request gives the same output
//     wherever its drafts come from. It takes the answer back into the plan, after
//     checking it against the order.
//   draft_server (the other side) keeps a copy of each request it drafts for: its tokens
//     and a sampler replayed over its output, which shapes the draft distribution as the
//     request's own sampler shapes the target's. Its proposer's KV cache is laid out in
//     the replica's block ids: the order's block table (claimed from the kv manager for
//     the request's drafts too) serves both.
//
// A session ties the two: an order of a new session makes the server forget every
// request first. The scheduler starts one whenever the block ids may have been given out
// anew behind the server's back (a recovery) or the server may have lost its copies (it
// restarted, or an exchange failed). Orders are served in the order they are sent, and
// requests that ended or were preempted are forgotten in the next order, before its slots.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/sample/sampling_params.hpp"
#include "engine/sched/scheduler.hpp"
#include "engine/speculative/speculative.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

struct draft_order_slot {
  request_id id;
  int32_t max_tokens = 0;           // drafts wanted, 1 .. max_draft_tokens
  int32_t from = 0;                 // position of tokens[0]; the server has the ones before
  std::vector<int32_t> tokens;      // the rest of the sequence
  std::vector<block_id> blocks;     // the request's table: its tokens and its drafts
  std::vector<float> uniforms;      // random drafts: max_tokens uniforms in [0, 1); greedy: none
  std::optional<sampling_params> sampling;  // with from == 0: how the request samples
  int32_t prompt_tokens = 0;        // with from == 0: how many of tokens are its prompt
  // KV eviction: tokens gone from the request's cache, so that its computed tokens (all
  // but its last) take that many fewer slots; the position each slot holds, sent when its
  // cache was compacted since the last order (the slots after them hold the positions
  // after, in order); whether RoPE positions are slots.
  int32_t evicted = 0;
  std::vector<int32_t> positions;
  bool rope_in_cache = false;
};

// KV eviction: a request's cache was compacted (kv_compaction), in `block_table` (its table
// then) into `new_table` (empty: the same).
struct draft_compaction {
  request_id id;
  std::vector<int32_t> kept;
  bool rotate = false;
  std::vector<block_id> block_table, new_table;
};

struct draft_order {
  uint64_t session = 0;
  std::vector<request_id> forget;   // requests whose copies go, before any slot
  std::vector<draft_compaction> compactions;  // made in order, after forget, before any slot
  std::vector<draft_order_slot> slots;
  std::vector<int32_t> tree;        // a token tree's widths: each slot's max_tokens are its
                                    // positions, and each answers their candidates
};

struct drafted {
  request_id id;
  std::vector<int32_t> tokens;  // at most the slot's max_tokens
  std::vector<float> q;         // [tokens.size()][vocab] they were drawn from; empty: chosen
                                // as certain (greedy)
  bool unknown = false;         // the server lacked the tokens before `from` (it restarted):
                                // none drafted, the whole sequence goes with the next order
  std::vector<std::vector<int32_t>> levels;  // a tree's: each position's candidates
};

struct draft_answer {
  uint64_t session = 0;
  std::vector<drafted> slots;   // one per order slot, in order
};

class draft_orders {
 public:
  // The next order starts `session`: the server forgets everything, and every request's
  // tokens go whole again.
  void restart(uint64_t session);
  uint64_t session() const { return session_; }
  // The request ended or lost its blocks (preempted): its copy goes with the next order.
  void forget(request_id id);
  // KV eviction: its cache was compacted; the server's copy follows with the next order.
  void compacted(const planned_compaction& c);

  // The order for the draft slots of `plan` (made after plan_drafts), or none when no
  // chunk has any. Draws the uniforms of random drafts from each request's draft stream.
  // With `tree` (speculative_config::tree), each slot asks for a tree's candidates.
  std::optional<draft_order> make(const step_plan& plan, scheduler& sched, std::span<const int32_t> tree = {});
  // Takes the answer to the last order into `plan` (take_drafts): a chunk whose request
  // ended meanwhile, or whose slot came back empty, computes no drafts. An answer that
  // does not fit the order is an error, and then nothing is taken; give_up() next.
  status take(step_plan& plan, scheduler& sched, draft_answer a, int32_t vocab);
  // The plan goes without drafts (the exchange failed): every chunk's draft slots are
  // dropped. The caller restarts the session, since the server may hold anything now.
  static void give_up(step_plan& plan);

 private:
  struct sent_slot {
    request_id id;
    int32_t max_tokens = 0;
  };
  uint64_t session_ = 0;
  std::unordered_map<request_id, int32_t> told_;  // tokens the server has, per request
  std::unordered_map<request_id, int32_t> told_evicted_;  // the evicted count it knows the slots of
  std::vector<request_id> forget_;
  std::vector<draft_compaction> compactions_;  // since the last order
  std::vector<sent_slot> last_;
  std::vector<int32_t> tree_;  // the last order's
  std::vector<draft_slot> slots_;
};

class draft_server {
 public:
  // p drafts (a model_proposer with a cache of its own over the replica's blocks).
  explicit draft_server(std::unique_ptr<proposer> p) : proposer_(std::move(p)) {}
  // The order's drafts. The order was checked on its way in (actors/wire/draft_codec.hpp):
  // tokens, blocks, lengths and sampler settings within the replica's limits.
  draft_answer serve(const draft_order& o);
  size_t num_requests() const { return copies_.size(); }

 private:
  void drop(request_id id);
  // The position each slot of its cache holds after the order `s` (KV eviction): the
  // order's, or the ones known, continued to its last computed token. False when they do
  // not fit the copy (the server lacks what the order assumes).
  bool follow_slots(const draft_order_slot& s, const request& copy);
  std::unique_ptr<proposer> proposer_;
  uint64_t session_ = 0;
  bool started_ = false;
  std::unordered_map<request_id, std::unique_ptr<request>> copies_;
  std::unordered_map<request_id, std::vector<int32_t>> slots_held_;  // KV eviction: follow_slots
  std::vector<draft_slot> slots_;
};

}  // namespace troupe
