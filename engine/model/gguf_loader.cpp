// GGUF checkpoints of the "llama" (Llama, Mistral) and "qwen2" architectures: shape from
// the {arch}.* metadata llama.cpp writes (rope scaling and sliding window included),
// tensors by their GGUF names (token_embd, blk.N.attn_q, blk.N.attn_q.bias, ...,
// output_norm, output, rope_freqs), vocabulary from tokenizer.ggml.* metadata.
#include <cmath>
#include <unordered_map>

#include "engine/model/gguf_file.hpp"
#include "engine/model/model.hpp"

namespace troupe {

namespace {

std::string utf8_lower_block() { return "\xe2\x96\x81"; }  // U+2581, SentencePiece's space

// GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
token_kind kind_of_gguf(int type) {
  switch (type) {
    case 2: return token_kind::unknown;
    case 3: return token_kind::control;
    case 4: return token_kind::user_defined;
    case 5: return token_kind::unused;
    case 6: return token_kind::byte;
    default: return token_kind::normal;
  }
}

// A byte-level BPE vocabulary (tokenizer.ggml.model "gpt2"): tokens stored through GPT-2's
// byte table, merges as "a b" strings, the pre-tokenizer named by tokenizer.ggml.pre.
expected<vocabulary> byte_level_vocabulary_from(const gguf_file& g) {
  const std::string path = g.path();
  vocabulary v;
  v.style = vocab_style::byte_level;
  const std::string pre = g.get_string("tokenizer.ggml.pre").value_or("default");
  if (pre == "llama-bpe" || pre == "llama3") v.pattern = llama3_pattern;
  else if (pre == "qwen2") v.pattern = qwen2_pattern;
  else if (pre == "default" || pre == "gpt-2") v.pattern = gpt2_pattern;
  else return error{path + ": pre-tokenizer '" + pre + "' is not supported (llama-bpe, qwen2 and gpt-2 are)"};
  v.ignore_merges = pre == "llama-bpe" || pre == "llama3";
  v.nfc = pre == "qwen2";
  auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) return tokens.err();
  std::vector<int> types(tokens->size(), 1);
  if (g.find("tokenizer.ggml.token_type")) {
    auto t = g.get_number_array("tokenizer.ggml.token_type");
    if (!t) return t.err();
    if (t->size() != tokens->size()) return error{path + ": tokenizer token types and tokens differ in count"};
    for (size_t i = 0; i < t->size(); ++i) types[i] = static_cast<int>((*t)[i]);
  }
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const token_kind k = kind_of_gguf(types[i]);
    std::string piece = (*tokens)[i];
    if (k == token_kind::normal) {
      auto bytes = byte_level_decode(piece);
      if (!bytes) return error{path + ": token " + std::to_string(i) + " '" + piece + "' is not byte-level text"};
      piece = std::move(*bytes);
      ids.emplace(piece, static_cast<int32_t>(i));
    }
    v.pieces.push_back(std::move(piece));
    v.kinds.push_back(k == token_kind::byte ? token_kind::normal : k);
  }
  if (g.find("tokenizer.ggml.merges")) {
    auto merges = g.get_string_array("tokenizer.ggml.merges");
    if (!merges) return merges.err();
    for (size_t r = 0; r < merges->size(); ++r) {
      const std::string& m = (*merges)[r];
      const size_t sp = m.find(' ', 1);
      auto a = sp == std::string::npos ? std::nullopt : byte_level_decode(m.substr(0, sp));
      auto b = sp == std::string::npos ? std::nullopt : byte_level_decode(m.substr(sp + 1));
      if (!a || !b || !ids.count(*a) || !ids.count(*b))
        return error{path + ": merge " + std::to_string(r) + " '" + m + "' names a piece the vocabulary lacks"};
      v.merges.emplace_back(ids[*a], ids[*b]);
    }
  }
  v.scores.assign(v.pieces.size(), 0.0f);
  const int64_t n = static_cast<int64_t>(v.pieces.size());
  auto special = [&](const char* key, int32_t fallback) {
    const int64_t id = g.get_int(key).value_or(fallback);
    return id >= 0 && id < n ? static_cast<int32_t>(id) : fallback;
  };
  v.eos_id = special("tokenizer.ggml.eos_token_id", -1);
  v.bos_id = special("tokenizer.ggml.bos_token_id", v.eos_id);
  v.add_bos = g.get_bool("tokenizer.ggml.add_bos_token").value_or(pre != "qwen2") && g.find("tokenizer.ggml.bos_token_id");
  v.unk_id = 0;
  if (auto e = validate(v)) return error{path + ": tokenizer: " + *e};
  return v;
}

expected<vocabulary> vocabulary_from(const gguf_file& g) {
  const std::string path = g.path();
  auto model_name = g.get_string("tokenizer.ggml.model");
  if (!model_name) return error{path + ": no tokenizer.ggml.model in the metadata"};
  if (*model_name == "gpt2") return byte_level_vocabulary_from(g);
  if (*model_name != "llama")
    return error{path + ": tokenizer '" + *model_name + "' is not supported (SentencePiece 'llama' and byte-level 'gpt2' are)"};
  auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) return tokens.err();
  vocabulary v;
  const std::string block = utf8_lower_block();
  v.pieces = std::move(tokens).value();
  for (auto& p : v.pieces)
    for (size_t at = p.find(block); at != std::string::npos; at = p.find(block, at + 1))
      p.replace(at, block.size(), 1, ' ');
  v.scores.assign(v.pieces.size(), 0.0f);
  if (g.find("tokenizer.ggml.scores")) {
    auto scores = g.get_number_array("tokenizer.ggml.scores");
    if (!scores) return scores.err();
    if (scores->size() != v.pieces.size()) return error{path + ": tokenizer scores and tokens differ in count"};
    for (size_t i = 0; i < scores->size(); ++i) v.scores[i] = static_cast<float>((*scores)[i]);
  }
  if (g.find("tokenizer.ggml.token_type")) {
    auto types = g.get_number_array("tokenizer.ggml.token_type");
    if (!types) return types.err();
    if (types->size() != v.pieces.size()) return error{path + ": tokenizer token types and tokens differ in count"};
    v.kinds.resize(types->size());
    for (size_t i = 0; i < types->size(); ++i) v.kinds[i] = kind_of_gguf(static_cast<int>((*types)[i]));
  }
  v.bos_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.bos_token_id").value_or(1));
  v.eos_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.eos_token_id").value_or(2));
  v.unk_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.unknown_token_id").value_or(0));
  v.add_space_prefix = g.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  if (auto e = validate(v)) return error{path + ": tokenizer: " + *e};
  return v;
}

class tensor_binder {
 public:
  tensor_binder(const gguf_file& g, model_weights& w) : g_(g), w_(w) {}

  // A matrix [rows][cols]: GGUF dims {cols, rows}.
  matrix_view matrix(const std::string& name, int64_t rows, int64_t cols) {
    const gguf_tensor* t = find(name);
    if (!t) return {};
    if (t->dims.size() != 2 || t->dims[0] != static_cast<uint64_t>(cols) ||
        t->dims[1] != static_cast<uint64_t>(rows)) {
      fail(name + " has shape " + shape(*t) + ", the model needs [" + std::to_string(cols) + ", " +
           std::to_string(rows) + "]");
      return {};
    }
    const dtype type = *dtype_of_ggml(t->ggml_type);
    if (type != dtype::q8_0)
      return matrix_view::dense(type, t->data, static_cast<int32_t>(rows), static_cast<int32_t>(cols));
    matrix_view v;
    v.type = dtype::q8_0;
    v.rows = static_cast<int32_t>(rows);
    v.cols = static_cast<int32_t>(cols);
    v.group_size = 32;
    v.q_row_stride = cols / 32 * 34;
    v.q_group_stride = 34;
    v.q = reinterpret_cast<const int8_t*>(t->data + 2);
    v.scale = t->data;
    v.s_row_stride = v.q_row_stride;
    v.s_group_stride = 34;
    v.scale_is_f16 = true;
    return v;
  }

  // A vector of n floats; 16-bit types are converted into a buffer the weights own.
  const float* vector(const std::string& name, int64_t n) {
    const gguf_tensor* t = find(name);
    if (!t) return nullptr;
    if (t->dims.size() != 1 || t->dims[0] != static_cast<uint64_t>(n)) {
      fail(name + " has shape " + shape(*t) + ", the model needs [" + std::to_string(n) + "]");
      return nullptr;
    }
    const dtype type = *dtype_of_ggml(t->ggml_type);
    if (type == dtype::q8_0) {
      fail(name + " is Q8_0; norm weights must be F32, F16 or BF16");
      return nullptr;
    }
    return w_.dense_vector(type, t->data, n);
  }

  bool has(const std::string& name) const { return g_.tensor(name) != nullptr; }
  bool ok() const { return error_.empty(); }
  const std::string& error_message() const { return error_; }

 private:
  const gguf_tensor* find(const std::string& name) {
    const gguf_tensor* t = g_.tensor(name);
    if (!t) fail("tensor " + name + " is missing");
    return ok() ? t : nullptr;
  }
  static std::string shape(const gguf_tensor& t) {
    std::string s = "[";
    for (size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + std::to_string(t.dims[i]);
    return s + "]";
  }
  void fail(const std::string& what) {
    if (error_.empty()) error_ = g_.path() + ": " + what;
  }
  const gguf_file& g_;
  model_weights& w_;
  std::string error_;
};

expected<model_config> config_from(const gguf_file& g) {
  const std::string path = g.path();
  auto arch = g.get_string("general.architecture");
  if (!arch) return error{path + ": no general.architecture in the metadata"};
  if (*arch != "llama" && *arch != "qwen2")
    return error{path + ": architecture '" + *arch + "' is not supported (llama and qwen2 are)"};
  const std::string a = *arch;
  auto need = [&](const std::string& key) -> expected<int64_t> {
    auto v = g.get_int(key);
    if (!v) return error{path + ": metadata " + key + " is missing or not an integer"};
    if (*v <= 0 || *v > (int64_t{1} << 30)) return error{path + ": metadata " + key + " = " + std::to_string(*v) + " is out of range"};
    return *v;
  };
  auto maybe = [&](const std::string& key, int32_t& field) -> status {
    if (!g.find(key)) return ok();
    auto v = need(key);
    if (!v) return v.err();
    field = static_cast<int32_t>(*v);
    return ok();
  };
  model_config c;
  c.family = a == "qwen2" ? model_family::qwen2 : model_family::llama;
  for (auto [key, field] : {std::pair{".embedding_length", &c.dim}, std::pair{".feed_forward_length", &c.hidden_dim},
                            std::pair{".block_count", &c.num_layers}, std::pair{".attention.head_count", &c.num_heads},
                            std::pair{".context_length", &c.max_seq_len}}) {
    auto v = need(a + key);
    if (!v) return v.err();
    *field = static_cast<int32_t>(*v);
  }
  c.num_kv_heads = c.num_heads;
  for (auto [key, field] : {std::pair{".attention.head_count_kv", &c.num_kv_heads},
                            std::pair{".rope.dimension_count", &c.rope_dim},
                            std::pair{".attention.key_length", &c.head_dim},
                            std::pair{".attention.sliding_window", &c.sliding_window}})
    if (auto st = maybe(a + key, *field); !st) return st.err();
  if (c.sliding_window > 0) c.family = model_family::mistral;
  c.rope_base = static_cast<float>(g.get_float(a + ".rope.freq_base").value_or(10000.0));
  c.rms_eps = static_cast<float>(g.get_float(a + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  // llama.cpp's converter stores Llama's Q and K rows permuted to rotate in pairs; qwen2
  // rotates in halves (NEOX order).
  c.rope = a == "qwen2" ? rope_layout::halves : rope_layout::pairs;
  c.qkv_bias = a == "qwen2";
  if (auto type = g.get_string(a + ".rope.scaling.type"); type && *type != "none") {
    rope_scaling& s = c.rope_scale;
    if (*type == "linear") s.type = rope_scaling_type::linear;
    else if (*type == "yarn") s.type = rope_scaling_type::yarn;
    else return error{path + ": " + a + ".rope.scaling.type '" + *type + "' is not supported (none, linear and yarn are)"};
    auto factor = g.get_float(a + ".rope.scaling.factor");
    if (!factor) return error{path + ": " + a + ".rope.scaling.factor is missing or not a number"};
    s.factor = static_cast<float>(*factor);
    s.original_context = static_cast<int32_t>(g.get_int(a + ".rope.scaling.original_context_length").value_or(c.max_seq_len));
    s.beta_fast = static_cast<float>(g.get_float(a + ".rope.scaling.yarn_beta_fast").value_or(32.0));
    s.beta_slow = static_cast<float>(g.get_float(a + ".rope.scaling.yarn_beta_slow").value_or(1.0));
    s.attention_factor = static_cast<float>(g.get_float(a + ".rope.scaling.attn_factor").value_or(0.0));
  }
  const gguf_tensor* emb = g.tensor("token_embd.weight");
  if (!emb || emb->dims.size() != 2) return error{path + ": tensor token_embd.weight is missing or not a matrix"};
  if (emb->dims[1] > static_cast<uint64_t>(max_vocab)) return error{path + ": vocabulary of " + std::to_string(emb->dims[1]) + " tokens is out of range"};
  c.vocab_size = static_cast<int32_t>(emb->dims[1]);
  if (auto e = validate(c)) return error{path + ": metadata describes an impossible model: " + *e};
  if (g.find(a + ".attention.value_length") && g.get_int(a + ".attention.value_length") != c.head_dim)
    return error{path + ": " + a + ".attention.value_length differs from the key length " + std::to_string(c.head_dim) +
                 " (not supported)"};
  return c;
}

}  // namespace

expected<model> load_gguf(mapped_file file) {
  auto parsed = gguf_file::parse(std::move(file));
  if (!parsed) return parsed.err();
  gguf_file& g = *parsed;
  auto cfg = config_from(g);
  if (!cfg) return cfg.err();
  model m;
  m.path = g.path();
  m.config = *cfg;
  const model_config& c = m.config;
  auto vocab = vocabulary_from(g);
  if (!vocab) return vocab.err();
  if (vocab->size() != c.vocab_size)
    return error{m.path + ": the vocabulary has " + std::to_string(vocab->size()) +
                 " tokens, the embedding " + std::to_string(c.vocab_size)};
  m.vocab = std::move(vocab).value();
  if (auto t = g.get_string("tokenizer.chat_template")) m.chat_template = std::move(*t);

  auto& w = m.weights;
  tensor_binder b(g, w);
  if (b.has("rope_freqs.weight")) {  // Llama 3's rope scaling, as per-pair divisors
    const float* f = b.vector("rope_freqs.weight", c.rope_dim / 2);
    if (!b.ok()) return error{b.error_message()};
    m.config.rope_freq_factors.assign(f, f + c.rope_dim / 2);
    if (auto e = validate(m.config)) return error{m.path + ": rope_freqs.weight: " + *e};
  }
  w.token_embedding = b.matrix("token_embd.weight", c.vocab_size, c.dim);
  w.layers.resize(c.num_layers);
  for (int32_t l = 0; l < c.num_layers && b.ok(); ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto& lw = w.layers[l];
    lw.attn_norm = b.vector(p + "attn_norm.weight", c.dim);
    lw.wq = b.matrix(p + "attn_q.weight", int64_t{c.num_heads} * c.head_dim, c.dim);
    lw.wk = b.matrix(p + "attn_k.weight", c.kv_dim(), c.dim);
    lw.wv = b.matrix(p + "attn_v.weight", c.kv_dim(), c.dim);
    if (c.qkv_bias) {
      lw.bq = b.vector(p + "attn_q.bias", c.q_dim());
      lw.bk = b.vector(p + "attn_k.bias", c.kv_dim());
      lw.bv = b.vector(p + "attn_v.bias", c.kv_dim());
    }
    lw.wo = b.matrix(p + "attn_output.weight", c.dim, int64_t{c.num_heads} * c.head_dim);
    lw.ffn_norm = b.vector(p + "ffn_norm.weight", c.dim);
    lw.w1 = b.matrix(p + "ffn_gate.weight", c.hidden_dim, c.dim);
    lw.w2 = b.matrix(p + "ffn_down.weight", c.dim, c.hidden_dim);
    lw.w3 = b.matrix(p + "ffn_up.weight", c.hidden_dim, c.dim);
  }
  w.final_norm = b.vector("output_norm.weight", c.dim);
  w.classifier = b.has("output.weight") ? b.matrix("output.weight", c.vocab_size, c.dim)
                                        : w.token_embedding;
  if (!b.ok()) return error{b.error_message()};
  m.weight_type = w.layers[0].wq.type;
  m.format = "GGUF v" + std::to_string(g.version()) + " (" + std::string(dtype_name(m.weight_type)) + ")";
  w.file = g.take_file();
  return m;
}

}  // namespace troupe
