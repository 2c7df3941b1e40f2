// step_codec: step plans between a scheduler and its pipeline stages (schema/step.capnp).
//
// step_encoder (scheduler side) sends a request's block table whole when the stages do
// not know it (a new request, or one resumed after preemption) and only the blocks added
// since otherwise; released requests are named once. step_decoder (stage side) checks
// every id, position, token and block against the limits it was given, keeps the tables,
// and rebuilds the engine's step_batch. A plan that fails a check changes nothing. The
// first plan of a scheduler session resets the stages' tables; a stale plan of an older
// session (a scheduler that died with plans on the wire) is refused.
//
// One encoder per scheduler, one decoder per stage; each used by one thread.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/forward/step_batch.hpp"
#include "engine/sched/step_plan.hpp"
#include "engine/util/expected.hpp"

namespace troupe::wire {

class step_encoder {
 public:
  // released: requests that finished or were aborted since the last plan.
  std::vector<uint8_t> encode(const step_plan& plan, std::span<const request_id> released);
  // The next plan tells the stages to forget every table and to accept only plans of
  // `session` from then on (a scheduler starts, or recovers from a lost stage).
  void restart(uint64_t session);

 private:
  std::unordered_map<request_id, size_t> sent_;  // table length the stages know, per request
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
};

class step_decoder {
 public:
  explicit step_decoder(const step_limits& lim) : lim_(lim) {}

  // The batch stays valid until the next decode().
  expected<decoded_step> decode(std::span<const uint8_t> bytes);
  size_t num_known_requests() const { return tables_.size(); }

 private:
  step_limits lim_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> tables_;
  uint64_t last_step_ = 0;
  uint64_t session_ = 0;
  bool any_ = false;
};

}  // namespace troupe::wire
