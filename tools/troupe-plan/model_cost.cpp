#include "tools/troupe-plan/model_cost.hpp"

namespace troupe::plan {

namespace {

struct known_shape {
  const char* name;
  int32_t dim, hidden, layers, heads, kv_heads, vocab, context;
  model_family family;
};

// From the models' published configurations.
constexpr known_shape known[] = {
    {"llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, model_family::llama},
    {"llama2-13b", 5120, 13824, 40, 40, 40, 32000, 4096, model_family::llama},
    {"llama3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, model_family::llama},
    {"llama3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, model_family::llama},
    {"mistral-7b", 4096, 14336, 32, 32, 8, 32000, 32768, model_family::mistral},
    {"qwen2-7b", 3584, 18944, 28, 28, 4, 152064, 32768, model_family::qwen2},
    {"110m", 768, 2048, 12, 12, 12, 32000, 1024, model_family::llama},
    {"1b", 2048, 5632, 22, 32, 4, 32000, 2048, model_family::llama},
};

}  // namespace

std::optional<model_shape> named_shape(const std::string& name, dtype weights, dtype kv) {
  for (const known_shape& k : known) {
    if (name != k.name) continue;
    model_shape s;
    s.name = k.name;
    s.config.dim = k.dim;
    s.config.hidden_dim = k.hidden;
    s.config.num_layers = k.layers;
    s.config.num_heads = k.heads;
    s.config.num_kv_heads = k.kv_heads;
    s.config.vocab_size = k.vocab;
    s.config.max_seq_len = k.context;
    s.config.family = k.family;
    s.config.qkv_bias = k.family == model_family::qwen2;
    s.config.head_dim = k.dim / k.heads;
    s.weights = weights;
    s.kv = kv;
    return s;
  }
  return std::nullopt;
}

std::vector<std::string> shape_names() {
  std::vector<std::string> names;
  for (const known_shape& k : known) names.emplace_back(k.name);
  return names;
}

double weight_bytes(int64_t params, dtype t) {
  const double n = static_cast<double>(params);
  switch (t) {
    case dtype::f32: return 4 * n;
    case dtype::f16:
    case dtype::bf16: return 2 * n;
    case dtype::q8_0: return n * 34.0 / 32.0;
  }
  return 4 * n;
}

double kv_bytes_per_token_layer(const model_config& c, dtype kv) {
  const double elements = 2.0 * c.kv_dim();  // K and V
  switch (kv) {
    case dtype::f32: return 4 * elements;
    case dtype::f16:
    case dtype::bf16: return 2 * elements;
    case dtype::q8_0: return elements + 2.0 * 4 * c.num_kv_heads;
  }
  return 4 * elements;
}

model_cost cost_of(const model_shape& m) {
  const model_config& c = m.config;
  const int64_t d = c.dim, h = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  model_cost r;
  r.layer_params = d * q * 2 + d * kv * 2 + d * h * 3;
  r.classifier_params = int64_t{c.vocab_size} * d;
  r.layer_bytes = weight_bytes(r.layer_params, m.weights);
  r.classifier_bytes = weight_bytes(r.classifier_params, m.weights);
  r.kv_token_layer_bytes = kv_bytes_per_token_layer(c, m.kv);
  r.layers = c.num_layers;
  r.dim = c.dim;
  r.q_dim = c.q_dim();
  return r;
}

}  // namespace troupe::plan
