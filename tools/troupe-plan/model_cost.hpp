// model_cost: what one token costs a Llama-family model, in bytes read and arithmetic, as
// the planner's roofline needs it: the weights a step streams (per pipeline stage and
// tensor shard), the matrix FLOPs per row, and the KV cache's bytes per token. From a
// loaded checkpoint's shape or from a named shape of a well-known model.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/model/config.hpp"
#include "kernels/common/dtype.hpp"

namespace troupe::plan {

struct model_shape {
  std::string name;
  model_config config;
  dtype weights = dtype::bf16;  // the layer matrices' and the classifier's type
  dtype kv = dtype::bf16;       // the KV cache's (f16 and bf16 cost the same)
};

// Well-known shapes by name (llama2-7b, llama3-8b, llama3-70b, mistral-7b, qwen2-7b, and
// troupe's synthetic 110m and 1b); weights and kv as given.
std::optional<model_shape> named_shape(const std::string& name, dtype weights, dtype kv);
std::vector<std::string> shape_names();

// Bytes of `params` weights of type `t` (q8_0: 34 bytes per 32).
double weight_bytes(int64_t params, dtype t);
// Bytes one token's keys and values take in one layer (q8_0: an int8 per element and a
// float scale per KV head).
double kv_bytes_per_token_layer(const model_config& c, dtype kv);

struct model_cost {
  int64_t layer_params = 0;       // the matrices of one layer
  int64_t classifier_params = 0;  // vocab x dim (the embedding row a token reads is free)
  double layer_bytes = 0;         // one layer's matrices, as stored
  double classifier_bytes = 0;
  double kv_token_layer_bytes = 0;  // one token's K and V in one layer
  int32_t layers = 0;
  int32_t dim = 0;
  int32_t q_dim = 0;

  double weight_bytes_total() const { return layer_bytes * layers + classifier_bytes; }
  double kv_bytes_per_token() const { return kv_token_layer_bytes * layers; }
  // Matrix FLOPs of one row through `layers_here` layers (2 per multiply-add).
  double layer_flops(int32_t layers_here) const { return 2.0 * static_cast<double>(layer_params) * layers_here; }
  double classifier_flops() const { return 2.0 * static_cast<double>(classifier_params); }
  // Attention's FLOPs for one query row over `context` positions in `layers_here` layers
  // (scores and the weighted sum of values).
  double attention_flops(int32_t layers_here, double context) const { return 4.0 * q_dim * context * layers_here; }
};

model_cost cost_of(const model_shape& m);

}  // namespace troupe::plan
