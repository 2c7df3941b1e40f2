// hf_config: a Hugging Face model's config.json read into a model_config, for the
// families troupe runs (model_type llama, mistral or qwen2). Every field is checked: a
// missing or mistyped one, an unknown architecture or an unsupported rope scaling is an
// error naming it.
//
// Fields read: model_type (else architectures[0]), hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size,
// max_position_embeddings, rms_norm_eps, rope_theta, rope_scaling (rope_type or type:
// default, linear, llama3, yarn, with factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings, beta_fast, beta_slow, attention_factor),
// tie_word_embeddings, attention_bias (llama), sliding_window (mistral),
// use_sliding_window (qwen2). Defaults are those of the families' reference configs.
#pragma once

#include <string>
#include <string_view>

#include "engine/model/config.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

struct hf_model_config {
  model_config config;
  bool tied_embeddings = false;  // the classifier is the embedding table (no lm_head.weight)
};

// `where` prefixes every error (the file's path).
expected<hf_model_config> parse_hf_config(std::string_view json_text, const std::string& where);

}  // namespace troupe
