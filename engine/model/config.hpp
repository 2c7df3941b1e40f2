// model_config: the shape of a Llama-family transformer, read from a checkpoint header or
// GGUF metadata and validated once (validate()) before anything is allocated from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/rope.hpp"

namespace troupe {

// The model families troupe runs: Llama 2 and 3, Mistral, Qwen2. They share the layer
// (pre-norm attention and SwiGLU) and differ in the details model_config records.
enum class model_family : uint8_t { llama, mistral, qwen2 };
const char* family_name(model_family f);

// How a model stretches its rotary frequencies past the context it was trained at.
//   linear: every frequency divided by factor (position interpolation);
//   llama3: low frequencies divided by factor, high ones kept, a smooth blend between
//           (wavelengths against original_context / low_freq_factor and / high_freq_factor);
//   yarn:   per-pair blend of interpolated and original frequencies between the
//           correction dimensions of beta_fast and beta_slow rotations, and cos/sin
//           scaled by attention_factor (0: 0.1 ln(factor) + 1).
enum class rope_scaling_type : uint8_t { none, linear, llama3, yarn };
const char* rope_scaling_name(rope_scaling_type t);

struct rope_scaling {
  rope_scaling_type type = rope_scaling_type::none;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;   // llama3
  float high_freq_factor = 4.0f;  // llama3
  int32_t original_context = 0;   // llama3, yarn: the context the model was trained at
  float beta_fast = 32.0f;        // yarn
  float beta_slow = 1.0f;         // yarn
  float attention_factor = 0.0f;  // yarn; 0: derived from factor
};

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
  rope_scaling rope_scale;
  // Per-pair divisors of the rotary frequencies, as GGUF files of Llama 3 carry them
  // (rope_freqs.weight) instead of naming the scaling; empty: none.
  std::vector<float> rope_freq_factors;

  model_family family = model_family::llama;
  bool qkv_bias = false;       // q, k and v projections add a bias (Qwen2)
  int32_t sliding_window = 0;  // a token attends to the last sliding_window positions, itself included (Mistral); 0: all

  int32_t q_dim() const { return num_heads * head_dim; }
  int32_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t num_params() const;
};

// Limits that keep arithmetic in int32/int64 and allocations sane; a header beyond them is
// corrupt or hostile.
inline constexpr int32_t max_dim = 1 << 16;
inline constexpr int32_t max_layers = 1 << 10;
inline constexpr int32_t max_vocab = 1 << 22;
inline constexpr int32_t max_context = 1 << 22;

// The rotary frequency of each of the rope_dim / 2 pairs, scaling applied, and the factor
// cos and sin are multiplied by (1 but for YaRN).
std::vector<float> rope_frequencies(const model_config& c);
float rope_attention_factor(const model_config& c);

// Fills head_dim/rope_dim when zero and checks every field and their relations.
// Returns a description of the first problem found.
std::optional<std::string> validate(model_config& c);

std::string describe(const model_config& c);

}  // namespace troupe
