// activations_codec: hidden states between pipeline stages, and the last stage's logits
// back to the scheduler (schema/step.capnp Activations): [num_tokens][dim] float32. Between
// GPU stages joined by a device link the hidden states go over NCCL instead, and the frame
// that travels on (wire_kind::linked_activations) says only which step and how many
// tokens: its data is empty.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv/block_id.hpp"
#include "engine/util/expected.hpp"

namespace troupe::wire {

// attention: the step's KV-eviction attention sums so far (schema/step.capnp), if any;
// failed_loads: the requests whose KV-tier loads failed in this stage or an earlier one;
// features: from the last stage, with its logits, the features the plan asked for.
std::vector<uint8_t> encode_activations(uint64_t step_id, int32_t num_tokens, int32_t dim, const float* data,
                                        std::span<const float> attention = {},
                                        std::span<const request_id> failed_loads = {},
                                        std::span<const float> features = {});

struct decoded_activations {
  uint64_t step_id = 0;
  int32_t num_tokens = 0;
  int32_t dim = 0;
  std::vector<float> data;       // [num_tokens][dim]
  std::vector<float> attention;  // the attention sums, as many as the receiver expects
  std::vector<request_id> failed_loads;  // KV tiers (at most max_tokens of them)
  std::vector<float> features;   // the last stage's: [rows][model dim]
};

// Checks the shape against what the receiver expects (dim, exactly `attention` sums and
// `features` values: the plan says how many) and its limits.
expected<decoded_activations> decode_activations(std::span<const uint8_t> bytes, int32_t dim, int32_t max_tokens,
                                                 int64_t attention = 0, int64_t features = 0);

// The frame of hidden states sent over a device link, and its reading (data stays empty,
// and is refused when present).
std::vector<uint8_t> encode_linked_activations(uint64_t step_id, int32_t num_tokens, int32_t dim,
                                               std::span<const float> attention = {});
expected<decoded_activations> decode_linked_activations(std::span<const uint8_t> bytes, int32_t dim, int32_t max_tokens,
                                                        int64_t attention = 0);

}  // namespace troupe::wire
