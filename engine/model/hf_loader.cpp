// Hugging Face model directories: config.json (engine/model/hf_config.hpp) and the
// weights in model.safetensors, or in the shards model.safetensors.index.json maps each
// tensor to. Tensors by their Hugging Face names (model.embed_tokens, model.layers.N.
// self_attn.q_proj, ..., model.norm, lm_head); Q and K rotate in halves (rope_layout::
// halves), as these checkpoints store them.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/model/hf_config.hpp"
#include "engine/model/model.hpp"
#include "engine/model/safetensors_file.hpp"

namespace troupe {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uintmax_t max_json_file = uintmax_t{64} << 20;

expected<std::string> read_text(const fs::path& p) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(p, ec);
  if (ec) return error{p.string() + ": " + ec.message()};
  if (size > max_json_file) return error{p.string() + ": " + std::to_string(size) + " bytes is too large for a JSON file"};
  std::ifstream in(p, std::ios::binary);
  if (!in) return error{p.string() + ": cannot be read"};
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The safetensors files of the directory: the index's shards, else model.safetensors.
expected<std::vector<fs::path>> weight_files(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    auto text = read_text(index);
    if (!text) return text.err();
    const json j = json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return error{index.string() + ": no weight_map object"};
    std::set<std::string> names;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string()) return error{index.string() + ": weight_map[" + tensor + "] is not a file name"};
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        return error{index.string() + ": weight_map[" + tensor + "] = '" + f + "' is not a file in the directory"};
      names.insert(f);
    }
    if (names.empty()) return error{index.string() + ": weight_map is empty"};
    std::vector<fs::path> out;
    for (const auto& n : names) out.push_back(dir / n);
    return out;
  }
  if (fs::exists(dir / "model.safetensors")) return std::vector<fs::path>{dir / "model.safetensors"};
  return error{dir.string() + ": no model.safetensors or model.safetensors.index.json"};
}

class tensor_binder {
 public:
  tensor_binder(const std::vector<safetensors_file>& files, model_weights& w) : files_(files), w_(w) {}

  matrix_view matrix(const std::string& name, int64_t rows, int64_t cols) {
    const safetensors_tensor* t = find(name);
    if (!t) return {};
    if (t->shape.size() != 2 || t->shape[0] != rows || t->shape[1] != cols) {
      fail(name + " has shape " + shape(*t) + ", the model needs [" + std::to_string(rows) + ", " +
           std::to_string(cols) + "]");
      return {};
    }
    return matrix_view::dense(t->type, t->data, static_cast<int32_t>(rows), static_cast<int32_t>(cols));
  }

  // A vector of n floats; 16-bit types are converted into a buffer the weights own.
  const float* vector(const std::string& name, int64_t n) {
    const safetensors_tensor* t = find(name);
    if (!t) return nullptr;
    if (t->shape.size() != 1 || t->shape[0] != n) {
      fail(name + " has shape " + shape(*t) + ", the model needs [" + std::to_string(n) + "]");
      return nullptr;
    }
    return w_.dense_vector(t->type, t->data, n);
  }

  bool has(const std::string& name) const { return lookup(name) != nullptr; }
  bool ok() const { return error_.empty(); }
  const std::string& error_message() const { return error_; }

 private:
  const safetensors_tensor* lookup(const std::string& name) const {
    for (const auto& f : files_)
      if (const safetensors_tensor* t = f.tensor(name)) return t;
    return nullptr;
  }
  const safetensors_tensor* find(const std::string& name) {
    const safetensors_tensor* t = lookup(name);
    if (!t) fail("tensor " + name + " is missing");
    return ok() ? t : nullptr;
  }
  static std::string shape(const safetensors_tensor& t) {
    std::string s = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
    return s + "]";
  }
  void fail(const std::string& what) {
    if (error_.empty()) error_ = what;
  }
  const std::vector<safetensors_file>& files_;
  model_weights& w_;
  std::string error_;
};

}  // namespace

expected<model> load_hf_dir(const std::string& path) {
  const fs::path dir(path);
  const fs::path config_path = dir / "config.json";
  auto text = read_text(config_path);
  if (!text) return error{path + ": a model directory needs config.json (" + text.err().message + ")"};
  auto hf = parse_hf_config(*text, config_path.string());
  if (!hf) return hf.err();
  auto names = weight_files(dir);
  if (!names) return names.err();
  std::vector<safetensors_file> files;
  for (const auto& n : *names) {
    auto mf = mapped_file::open(n.string());
    if (!mf) return mf.err();
    auto st = safetensors_file::parse(std::move(mf).value());
    if (!st) return st.err();
    files.push_back(std::move(st).value());
  }

  model m;
  m.path = path;
  m.config = hf->config;
  const model_config& c = m.config;
  auto& w = m.weights;
  tensor_binder b(files, w);
  w.token_embedding = b.matrix("model.embed_tokens.weight", c.vocab_size, c.dim);
  w.layers.resize(c.num_layers);
  for (int32_t l = 0; l < c.num_layers && b.ok(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto& lw = w.layers[l];
    lw.attn_norm = b.vector(p + "input_layernorm.weight", c.dim);
    lw.wq = b.matrix(p + "self_attn.q_proj.weight", c.q_dim(), c.dim);
    lw.wk = b.matrix(p + "self_attn.k_proj.weight", c.kv_dim(), c.dim);
    lw.wv = b.matrix(p + "self_attn.v_proj.weight", c.kv_dim(), c.dim);
    lw.wo = b.matrix(p + "self_attn.o_proj.weight", c.dim, c.q_dim());
    if (c.qkv_bias) {
      lw.bq = b.vector(p + "self_attn.q_proj.bias", c.q_dim());
      lw.bk = b.vector(p + "self_attn.k_proj.bias", c.kv_dim());
      lw.bv = b.vector(p + "self_attn.v_proj.bias", c.kv_dim());
    }
    lw.ffn_norm = b.vector(p + "post_attention_layernorm.weight", c.dim);
    lw.w1 = b.matrix(p + "mlp.gate_proj.weight", c.hidden_dim, c.dim);
    lw.w2 = b.matrix(p + "mlp.down_proj.weight", c.dim, c.hidden_dim);
    lw.w3 = b.matrix(p + "mlp.up_proj.weight", c.hidden_dim, c.dim);
  }
  w.final_norm = b.vector("model.norm.weight", c.dim);
  if (hf->tied_embeddings || !b.has("lm_head.weight"))
    w.classifier = w.token_embedding;
  else
    w.classifier = b.matrix("lm_head.weight", c.vocab_size, c.dim);
  if (!b.ok()) return error{path + ": " + b.error_message()};
  m.weight_type = w.layers[0].wq.type;
  m.format = std::string("Hugging Face ") + family_name(c.family) + " (safetensors, " +
             std::string(dtype_name(m.weight_type)) + (files.size() > 1 ? ", " + std::to_string(files.size()) + " shards)" : ")");
  for (auto& f : files) w.files.push_back(f.take_file());
  return m;
}

}  // namespace troupe
