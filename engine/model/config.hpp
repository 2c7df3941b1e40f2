// model_config: the shape of a Llama-family transformer, read from a checkpoint header or
// GGUF metadata and validated once (validate()) before anything is allocated from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cpu/rope.hpp"

namespace troupe {

struct model_config {
  int32_t dim = 0;           // residual stream width
  int32_t hidden_dim = 0;    // SwiGLU inner width
  int32_t num_layers = 0;
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;  // key/value heads (grouped-query attention when fewer)
  int32_t vocab_size = 0;
  int32_t max_seq_len = 0;   // context length the model was trained for
  int32_t head_dim = 0;      // dim / num_heads
  int32_t rope_dim = 0;      // rotated dimensions per head (head_dim unless the model says)
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  rope_layout rope = rope_layout::pairs;

  int32_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t num_params() const;
};

// Limits that keep arithmetic in int32/int64 and allocations sane; a header beyond them is
// corrupt or hostile.
inline constexpr int32_t max_dim = 1 << 16;
inline constexpr int32_t max_layers = 1 << 10;
inline constexpr int32_t max_vocab = 1 << 22;
inline constexpr int32_t max_context = 1 << 22;

// Fills head_dim/rope_dim when zero and checks every field and their relations.
// Returns a description of the first problem found.
std::optional<std::string> validate(model_config& c);

std::string describe(const model_config& c);

}  // namespace troupe
