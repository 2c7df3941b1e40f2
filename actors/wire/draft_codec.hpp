// draft_codec: speculative drafts between a scheduler and its replica's draft actor
// (schema/draft.capnp, engine/speculative/draft_exchange.hpp). Orders and answers as bytes,
// each checked on its way in against the replica's limits: an order's tokens inside the
// vocabulary, its block ids inside the pool, its tables long enough for the drafts, its
// sampler settings valid; an answer's rows of the vocabulary's size. A message that fails
// a check is an error, never a partial result.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/speculative/draft_exchange.hpp"
#include "engine/util/expected.hpp"

namespace troupe::wire {

struct draft_limits {
  uint32_t num_blocks = 0;  // block ids must be below this
  int32_t block_size = 16;
  int32_t context = 0;      // tokens per sequence at most
  int32_t vocab = 0;
  int32_t max_slots = 1024; // requests per order
};

std::vector<uint8_t> encode_draft_order(const draft_order& o);
expected<draft_order> decode_draft_order(std::span<const uint8_t> bytes, const draft_limits& lim);

// An answer; a refusal (the order failed its checks) carries only why.
std::vector<uint8_t> encode_drafts(const draft_answer& a, int32_t vocab);
std::vector<uint8_t> encode_draft_refusal(const std::string& why);
expected<draft_answer> decode_drafts(std::span<const uint8_t> bytes, const draft_limits& lim);

}  // namespace troupe::wire
