// activations_codec: hidden states between pipeline stages, and the last stage's logits
// back to the scheduler (schema/step.capnp Activations): [num_tokens][dim] float32.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/util/expected.hpp"

namespace troupe::wire {

std::vector<uint8_t> encode_activations(uint64_t step_id, int32_t num_tokens, int32_t dim, const float* data);

struct decoded_activations {
  uint64_t step_id = 0;
  int32_t num_tokens = 0;
  int32_t dim = 0;
  std::vector<float> data;  // [num_tokens][dim]
};

// Checks the shape against what the receiver expects (dim) and its limits.
expected<decoded_activations> decode_activations(std::span<const uint8_t> bytes, int32_t dim, int32_t max_tokens);

}  // namespace troupe::wire
