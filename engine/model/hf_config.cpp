#include "engine/model/hf_config.hpp"

#include <cmath>

#include <nlohmann/json.hpp>

namespace troupe {

namespace {

using json = nlohmann::json;

class fields {
 public:
  fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  error bad(const std::string& what) const { return error{where_ + ": " + what}; }

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  expected<int32_t> count(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!has(key)) {
      if (fallback) return static_cast<int32_t>(*fallback);
      return bad(std::string(key) + " is missing");
    }
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (int64_t{1} << 30))
      return bad(std::string(key) + " = " + v.dump() + " must be a positive integer");
    return static_cast<int32_t>(v.get<int64_t>());
  }

  expected<float> number(const char* key, double fallback) const {
    if (!has(key)) return static_cast<float>(fallback);
    const json& v = j_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>())) return bad(std::string(key) + " = " + v.dump() + " must be a number");
    return static_cast<float>(v.get<double>());
  }

  expected<bool> flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) return bad(std::string(key) + " = " + j_[key].dump() + " must be true or false");
    return j_[key].get<bool>();
  }

 private:
  const json& j_;
  std::string where_;
};

expected<model_family> family_of(const json& j, const std::string& where) {
  std::string type;
  if (j.contains("model_type") && j["model_type"].is_string()) {
    type = j["model_type"].get<std::string>();
  } else if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
             j["architectures"][0].is_string()) {
    const std::string arch = j["architectures"][0].get<std::string>();
    if (arch == "LlamaForCausalLM") type = "llama";
    else if (arch == "MistralForCausalLM") type = "mistral";
    else if (arch == "Qwen2ForCausalLM") type = "qwen2";
    else type = arch;
  } else {
    return error{where + ": neither model_type nor architectures says what the model is"};
  }
  if (type == "llama") return model_family::llama;
  if (type == "mistral") return model_family::mistral;
  if (type == "qwen2") return model_family::qwen2;
  return error{where + ": model_type '" + type + "' is not supported (llama, mistral and qwen2 are)"};
}

expected<rope_scaling> scaling_of(const json& j, const fields& top, int32_t max_positions) {
  rope_scaling s;
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return s;
  const json& r = j["rope_scaling"];
  if (!r.is_object()) return top.bad("rope_scaling must be an object or null");
  std::string type;
  for (const char* key : {"rope_type", "type"})
    if (r.contains(key) && r[key].is_string()) {
      type = r[key].get<std::string>();
      break;
    }
  if (type.empty()) return top.bad("rope_scaling has no rope_type");
  if (type == "default") return s;
  if (type == "linear") s.type = rope_scaling_type::linear;
  else if (type == "llama3") s.type = rope_scaling_type::llama3;
  else if (type == "yarn") s.type = rope_scaling_type::yarn;
  else return top.bad("rope_scaling type '" + type + "' is not supported (default, linear, llama3 and yarn are)");
  const fields f(r, top.bad("rope_scaling").message);
  auto factor = f.number("factor", 0.0);
  if (!factor) return factor.err();
  if (!f.has("factor")) return f.bad("factor is missing");
  s.factor = *factor;
  auto original = f.count("original_max_position_embeddings",
                          s.type == rope_scaling_type::llama3 ? std::nullopt : std::optional<int64_t>(max_positions));
  if (s.type != rope_scaling_type::linear) {
    if (!original) return original.err();
    s.original_context = *original;
  }
  if (s.type == rope_scaling_type::llama3) {
    auto low = f.number("low_freq_factor", 1.0), high = f.number("high_freq_factor", 4.0);
    if (!low) return low.err();
    if (!high) return high.err();
    s.low_freq_factor = *low;
    s.high_freq_factor = *high;
  }
  if (s.type == rope_scaling_type::yarn) {
    auto fast = f.number("beta_fast", 32.0), slow = f.number("beta_slow", 1.0), att = f.number("attention_factor", 0.0);
    if (!fast) return fast.err();
    if (!slow) return slow.err();
    if (!att) return att.err();
    s.beta_fast = *fast;
    s.beta_slow = *slow;
    s.attention_factor = *att;
  }
  return s;
}

}  // namespace

expected<hf_model_config> parse_hf_config(std::string_view json_text, const std::string& where) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return error{where + ": not a JSON object"};
  auto family = family_of(j, where);
  if (!family) return family.err();
  const fields f(j, where);
  hf_model_config out;
  model_config& c = out.config;
  c.family = *family;
  struct int_field {
    const char* key;
    int32_t* into;
  };
  for (const int_field& x : {int_field{"hidden_size", &c.dim}, int_field{"intermediate_size", &c.hidden_dim},
                             int_field{"num_hidden_layers", &c.num_layers},
                             int_field{"num_attention_heads", &c.num_heads}, int_field{"vocab_size", &c.vocab_size}}) {
    auto v = f.count(x.key);
    if (!v) return v.err();
    *x.into = *v;
  }
  auto kv_heads = f.count("num_key_value_heads", c.num_heads);
  if (!kv_heads) return kv_heads.err();
  c.num_kv_heads = *kv_heads;
  auto head_dim = f.count("head_dim", 0);
  if (!head_dim) return head_dim.err();
  c.head_dim = *head_dim;
  // The families' reference defaults for a context the file does not state.
  const int64_t default_context = c.family == model_family::llama ? 2048 : c.family == model_family::mistral ? 131072 : 32768;
  auto context = f.count("max_position_embeddings", default_context);
  if (!context) return context.err();
  c.max_seq_len = *context;
  auto eps = f.number("rms_norm_eps", 1e-6);
  if (!eps) return eps.err();
  c.rms_eps = *eps;
  auto theta = f.number("rope_theta", 10000.0);
  if (!theta) return theta.err();
  c.rope_base = *theta;
  c.rope = rope_layout::halves;
  auto scaling = scaling_of(j, f, c.max_seq_len);
  if (!scaling) return scaling.err();
  c.rope_scale = *scaling;
  auto tied = f.flag("tie_word_embeddings", false);
  if (!tied) return tied.err();
  out.tied_embeddings = *tied;

  switch (c.family) {
    case model_family::llama: {
      auto bias = f.flag("attention_bias", false);
      if (!bias) return bias.err();
      c.qkv_bias = *bias;
      if (c.qkv_bias) return f.bad("attention_bias = true (biases on every projection, o_proj's included) is not supported");
      break;
    }
    case model_family::mistral:
      if (f.has("sliding_window")) {
        auto w = f.count("sliding_window");
        if (!w) return w.err();
        c.sliding_window = *w;
      }
      break;
    case model_family::qwen2: {
      c.qkv_bias = true;
      auto sliding = f.flag("use_sliding_window", false);
      if (!sliding) return sliding.err();
      if (*sliding) return f.bad("use_sliding_window = true (a window on some layers) is not supported");
      break;
    }
  }
  if (auto e = validate(c)) return error{where + ": describes an impossible model: " + *e};
  return out;
}

}  // namespace troupe
