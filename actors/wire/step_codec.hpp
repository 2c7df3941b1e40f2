// step_codec: step plans between a scheduler and its pipeline stages (schema/step.capnp).
//
// step_encoder (scheduler side) sends a request's block table whole when the stages do
// not know it (a new request, or one resumed after preemption) or it changed other than
// by growing (blocks handed back, or replaced by copies), and only the blocks added since
// otherwise; released requests are named once. step_decoder (stage side) checks
// every id, position, token and block against the limits it was given, keeps the tables,
// and rebuilds the engine's step_batch. A plan that fails a check changes nothing. The
// first plan of a scheduler session resets the stages' tables; a stale plan of an older
// session (a scheduler that died with plans on the wire) is refused.
//
// A sampled chunk may carry the choice of its token (a token_choice: greedy, or a draw
// with its truncation and uniform u); when every sampled chunk of a plan does, the last
// stage returns the chosen tokens (encode_step_result) instead of their logits. With
// speculative decoding a chunk's last tokens may be drafts: each wants a row of logits
// too (the rows after the known token's), and a choice for them must be greedy (each
// row's argmax; verifying a draw needs the logits).
//
// One encoder per scheduler, one decoder per stage; each used by one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/forward/step_batch.hpp"
#include "engine/sched/step_plan.hpp"
#include "engine/util/expected.hpp"
#include "kernels/cpu/sample.hpp"

namespace troupe::wire {

class step_encoder {
 public:
  // released: requests that finished or were aborted since the last plan. choices: empty,
  // or one per chunk of the plan (nullopt: the chunk's logits come back). features: empty,
  // or per chunk of the plan how many of its last tokens' features come back.
  std::vector<uint8_t> encode(const step_plan& plan, std::span<const request_id> released,
                              std::span<const std::optional<token_choice>> choices = {},
                              std::span<const int32_t> features = {});
  // The next plan tells the stages to forget every table and to accept only plans of
  // `session` from then on (a scheduler starts, or recovers from a lost stage).
  void restart(uint64_t session);

 private:
  std::unordered_map<request_id, std::vector<block_id>> sent_;  // the table the stages know, per request
  uint64_t next_step_ = 0;
  uint64_t session_ = 0;
  bool reset_pending_ = true;
};

struct step_limits {
  int32_t vocab = 0;
  int32_t context = 0;           // positions per sequence
  uint32_t num_blocks = 0;       // block ids must be below this
  int32_t block_size = 16;
  int32_t max_step_tokens = 8192;
  int32_t max_chunks = 1024;
};

struct decoded_step {
  uint64_t step_id = 0;
  std::vector<request_id> ids;  // per sequence of the batch
  step_batch batch;             // its block tables point into the decoder
  // Per logit row (a sampled chunk's, and one per draft, in batch order): how the last
  // stage chooses its token; empty unless every sampled chunk asked for that.
  std::vector<token_choice> choices;
  std::vector<request_id> chosen_ids;  // the requests of those rows
  // The batch rows (tokens, in order) whose features the last stage returns.
  std::vector<int32_t> feature_rows;
  // Token trees: batch.sequences' tree_parents point into these (the root's -1, then each
  // draft's parent as a batch position within its sequence).
  std::vector<std::vector<int32_t>> tree_parents;
  // A sliding-window model under KV eviction: the sequences' window_first point into these.
  std::vector<std::vector<int32_t>> window_first;
  // KV eviction: batch.compactions point into these (each request's table as it stood
  // before the plan, the one the plan leaves it, and what it keeps).
  std::vector<std::vector<block_id>> compaction_tables, compaction_new_tables;
  std::vector<std::vector<int32_t>> compaction_kept;
  std::vector<uint8_t> compaction_rotate;
  // KV eviction: the attention sums of the chunks that ask for them (schema/step.capnp),
  // zero, chunk after chunk; batch.sequences' attention_mass point into it.
  std::vector<float> attention;
  // KV tiers: blocks to fill before the step, and to copy down after it; blocks of
  // waiting requests to read up in the background.
  std::vector<tier_move> tier_loads, tier_saves;
  std::vector<tier_key> tier_prefetch;
  std::vector<tier_move> kv_pushes;  // disaggregation: blocks sent to decode replicas after it
};

// The tokens a last stage chose: (request, token) per logit row, in batch order.
struct chosen_token {
  request_id id;
  int32_t token = 0;
};
// features: the rows the plan asked for ([rows][dim]), if any.
std::vector<uint8_t> encode_step_result(uint64_t step_id, std::span<const chosen_token> tokens,
                                        std::span<const float> attention = {},
                                        std::span<const request_id> failed_loads = {},
                                        std::span<const float> features = {});
struct step_result {
  std::vector<chosen_token> tokens;
  std::vector<float> attention;  // the step's attention sums, as many as the receiver expects
  std::vector<request_id> failed_loads;  // KV tiers: requests whose loads failed
  std::vector<float> features;   // [rows][dim], as many as the receiver expects
};
// Checks that the count is at most max_rows, every token is inside the vocabulary, and
// exactly `attention` sums and `features` floats came back.
expected<step_result> decode_step_result(std::span<const uint8_t> bytes, int32_t vocab, int32_t max_rows,
                                         int64_t attention = 0, int64_t features = 0);

class step_decoder {
 public:
  explicit step_decoder(const step_limits& lim) : lim_(lim) {}

  // The batch stays valid until the next decode().
  expected<decoded_step> decode(std::span<const uint8_t> bytes);
  size_t num_known_requests() const { return tables_.size(); }

 private:
  step_limits lim_;
  std::unordered_map<uint64_t, std::vector<block_id>> tables_;
  std::vector<int32_t> chunk_tokens_;  // (a chunk's tokens as the batch takes them)
  uint64_t last_step_ = 0;
  uint64_t session_ = 0;
  bool any_ = false;
};

}  // namespace troupe::wire
