// Hugging Face model directories: config.json and model.safetensors, or shards of it
// with model.safetensors.index.json.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/model/checkpoint_writer.hpp"
#include "engine/model/file_out.hpp"

namespace troupe {

namespace {

using json = nlohmann::json;

struct hf_tensor {
  tensor_role role;
  int32_t layer;
  int32_t rows, cols;  // rows 0: a vector of cols
  std::string name;
  dtype type;
};

std::vector<hf_tensor> hf_tensors(const checkpoint_spec& s) {
  const model_config& c = s.config;
  const dtype t = s.type;
  std::vector<hf_tensor> out;
  out.push_back({tensor_role::embedding, -1, c.vocab_size, c.dim, "model.embed_tokens.weight", t});
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({tensor_role::attn_norm, l, 0, c.dim, p + "input_layernorm.weight", dtype::f32});
    out.push_back({tensor_role::wq, l, c.q_dim(), c.dim, p + "self_attn.q_proj.weight", t});
    out.push_back({tensor_role::wk, l, c.kv_dim(), c.dim, p + "self_attn.k_proj.weight", t});
    out.push_back({tensor_role::wv, l, c.kv_dim(), c.dim, p + "self_attn.v_proj.weight", t});
    if (c.qkv_bias) {
      out.push_back({tensor_role::bq, l, 0, c.q_dim(), p + "self_attn.q_proj.bias", dtype::f32});
      out.push_back({tensor_role::bk, l, 0, c.kv_dim(), p + "self_attn.k_proj.bias", dtype::f32});
      out.push_back({tensor_role::bv, l, 0, c.kv_dim(), p + "self_attn.v_proj.bias", dtype::f32});
    }
    out.push_back({tensor_role::wo, l, c.dim, c.q_dim(), p + "self_attn.o_proj.weight", t});
    out.push_back({tensor_role::ffn_norm, l, 0, c.dim, p + "post_attention_layernorm.weight", dtype::f32});
    out.push_back({tensor_role::w1, l, c.hidden_dim, c.dim, p + "mlp.gate_proj.weight", t});
    out.push_back({tensor_role::w3, l, c.hidden_dim, c.dim, p + "mlp.up_proj.weight", t});
    out.push_back({tensor_role::w2, l, c.dim, c.hidden_dim, p + "mlp.down_proj.weight", t});
  }
  out.push_back({tensor_role::final_norm, -1, 0, c.dim, "model.norm.weight", dtype::f32});
  if (!s.shared_classifier) out.push_back({tensor_role::classifier, -1, c.vocab_size, c.dim, "lm_head.weight", t});
  return out;
}

const char* st_dtype(dtype t) { return t == dtype::f16 ? "F16" : t == dtype::bf16 ? "BF16" : "F32"; }

json config_json(const checkpoint_spec& s) {
  const model_config& c = s.config;
  json j;
  const char* arch = c.family == model_family::qwen2     ? "Qwen2ForCausalLM"
                     : c.family == model_family::mistral ? "MistralForCausalLM"
                                                         : "LlamaForCausalLM";
  j["architectures"] = json::array({arch});
  j["model_type"] = family_name(c.family);
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.rms_eps;
  j["rope_theta"] = c.rope_base;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = s.shared_classifier;
  j["torch_dtype"] = s.type == dtype::f16 ? "float16" : s.type == dtype::bf16 ? "bfloat16" : "float32";
  const rope_scaling& r = c.rope_scale;
  if (r.type == rope_scaling_type::none) {
    j["rope_scaling"] = nullptr;
  } else {
    json rs = {{"rope_type", rope_scaling_name(r.type)}, {"factor", r.factor}};
    if (r.type == rope_scaling_type::llama3) {
      rs["low_freq_factor"] = r.low_freq_factor;
      rs["high_freq_factor"] = r.high_freq_factor;
      rs["original_max_position_embeddings"] = r.original_context;
    }
    if (r.type == rope_scaling_type::yarn) {
      rs["original_max_position_embeddings"] = r.original_context;
      rs["beta_fast"] = r.beta_fast;
      rs["beta_slow"] = r.beta_slow;
      if (r.attention_factor > 0) rs["attention_factor"] = r.attention_factor;
    }
    j["rope_scaling"] = rs;
  }
  if (c.family == model_family::mistral) j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  if (c.family == model_family::qwen2) j["use_sliding_window"] = false;
  if (c.family == model_family::llama) j["attention_bias"] = false;
  return j;
}

}  // namespace

status write_hf_dir(const std::string& dir, const checkpoint_spec& spec, const weight_source& src_in,
                    const std::function<void(double)>& progress, uint64_t max_shard_bytes) {
  model_config c = spec.config;
  if (auto e = validate(c)) return error{"invalid model shape: " + *e};
  if (spec.type != dtype::f32 && spec.type != dtype::f16 && spec.type != dtype::bf16)
    return error{"Hugging Face checkpoints hold f32, f16 or bf16 weights, not " + std::string(dtype_name(spec.type))};
  if (c.family == model_family::llama && c.qkv_bias) return error{"a Llama checkpoint with q/k/v biases has no Hugging Face form"};
  if (c.family != model_family::mistral && c.sliding_window > 0)
    return error{"only Mistral checkpoints carry a sliding window in their config"};
  if (!c.rope_freq_factors.empty()) return error{"per-pair rope frequency factors have no Hugging Face form"};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return error{dir + ": cannot create: " + ec.message()};
  checkpoint_spec validated = spec;
  validated.config = c;
  const weight_source src = with_rope_layout(src_in, c, c.rope, rope_layout::halves);

  {
    std::ofstream cfg(std::filesystem::path(dir) / "config.json");
    cfg << config_json(validated).dump(2) << "\n";
    if (!cfg) return error{dir + "/config.json: write failed"};
  }

  // Tensors in order, cut into shards of at most max_shard_bytes (one file when 0).
  const auto tensors = hf_tensors(validated);
  auto bytes_of = [](const hf_tensor& t) { return uint64_t(std::max(t.rows, 1)) * t.cols * (t.type == dtype::f32 ? 4 : 2); };
  std::vector<std::vector<const hf_tensor*>> shards(1);
  uint64_t in_shard = 0;
  for (const auto& t : tensors) {
    if (max_shard_bytes > 0 && in_shard > 0 && in_shard + bytes_of(t) > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += bytes_of(t);
  }
  auto shard_name = [&](size_t i) {
    if (shards.size() == 1) return std::string("model.safetensors");
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    return std::string(name);
  };
  std::vector<float> row(std::max({c.dim, c.hidden_dim, c.q_dim()}));
  std::vector<uint16_t> half_row(row.size());
  double done = 0, total = 0;
  for (const auto& t : tensors) total += std::max(t.rows, 1);
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    json header = json::object();
    uint64_t offset = 0;
    for (const hf_tensor* t : shards[i]) {
      header[t->name] = {{"dtype", st_dtype(t->type)},
                         {"shape", t->rows ? json::array({t->rows, t->cols}) : json::array({t->cols})},
                         {"data_offsets", json::array({offset, offset + bytes_of(*t)})}};
      offset += bytes_of(*t);
      weight_map[t->name] = shard_name(i);
    }
    header["__metadata__"] = {{"format", "pt"}};
    std::string text = header.dump();
    // The data starts at a multiple of 8 and every tensor's size is a multiple of 4 (its
    // columns are even), so every tensor is aligned to its element size.
    while ((8 + text.size()) % 8 != 0) text += ' ';
    file_out f(dir + "/" + shard_name(i));
    f.pod(static_cast<uint64_t>(text.size()));
    f.bytes(text.data(), text.size());
    for (const hf_tensor* t : shards[i]) {
      for (int32_t r = 0; r < std::max(t->rows, 1); ++r) {
        src(t->role, t->layer, r, row.data(), t->cols);
        if (t->type == dtype::f32) {
          f.bytes(row.data(), sizeof(float) * t->cols);
          continue;
        }
        for (int32_t k = 0; k < t->cols; ++k)
          half_row[k] = t->type == dtype::f16 ? f32_to_f16(row[k]) : f32_to_bf16(row[k]);
        f.bytes(half_row.data(), sizeof(uint16_t) * t->cols);
      }
      done += std::max(t->rows, 1);
      if (progress) progress(done / total);
    }
    if (auto st = f.close(); !st) return st;
  }
  if (shards.size() > 1) {
    uint64_t total_size = 0;
    for (const auto& t : tensors) total_size += bytes_of(t);
    std::ofstream index(std::filesystem::path(dir) / "model.safetensors.index.json");
    index << json{{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}}.dump(2) << "\n";
    if (!index) return error{dir + "/model.safetensors.index.json: write failed"};
  }
  return ok();
}

}  // namespace troupe
