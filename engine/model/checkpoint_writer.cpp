#include "engine/model/checkpoint_writer.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/model/file_out.hpp"

namespace troupe {

namespace {

struct tensor_desc {
  tensor_role role;
  int32_t layer;
  int32_t rows, cols;
  std::string gguf_name;
  bool is_norm;                             // a vector, stored as F32
  const std::vector<float>* fixed = nullptr;  // its values, when they come from the config, not the source
};

const char* gguf_arch(model_family f) { return f == model_family::qwen2 ? "qwen2" : "llama"; }
rope_layout gguf_rope(model_family f) { return f == model_family::qwen2 ? rope_layout::halves : rope_layout::pairs; }

// Llama 3's rope scaling as llama.cpp's GGUF files carry it: per-pair divisors of the
// unscaled frequencies.
std::vector<float> llama3_freq_factors(const model_config& c) {
  model_config plain = c;
  plain.rope_scale = {};
  plain.rope_freq_factors.clear();
  const std::vector<float> base = rope_frequencies(plain), scaled = rope_frequencies(c);
  std::vector<float> out(base.size());
  for (size_t i = 0; i < base.size(); ++i) out[i] = base[i] / scaled[i];
  return out;
}

std::vector<tensor_desc> gguf_tensors(const checkpoint_spec& s) {
  const model_config& c = s.config;
  std::vector<tensor_desc> t;
  t.push_back({tensor_role::embedding, -1, c.vocab_size, c.dim, "token_embd.weight", false});
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t.push_back({tensor_role::attn_norm, l, 1, c.dim, p + "attn_norm.weight", true});
    t.push_back({tensor_role::wq, l, c.num_heads * c.head_dim, c.dim, p + "attn_q.weight", false});
    t.push_back({tensor_role::wk, l, c.kv_dim(), c.dim, p + "attn_k.weight", false});
    t.push_back({tensor_role::wv, l, c.kv_dim(), c.dim, p + "attn_v.weight", false});
    if (c.qkv_bias) {
      t.push_back({tensor_role::bq, l, 1, c.q_dim(), p + "attn_q.bias", true});
      t.push_back({tensor_role::bk, l, 1, c.kv_dim(), p + "attn_k.bias", true});
      t.push_back({tensor_role::bv, l, 1, c.kv_dim(), p + "attn_v.bias", true});
    }
    t.push_back({tensor_role::wo, l, c.dim, c.num_heads * c.head_dim, p + "attn_output.weight", false});
    t.push_back({tensor_role::ffn_norm, l, 1, c.dim, p + "ffn_norm.weight", true});
    t.push_back({tensor_role::w1, l, c.hidden_dim, c.dim, p + "ffn_gate.weight", false});
    t.push_back({tensor_role::w2, l, c.dim, c.hidden_dim, p + "ffn_down.weight", false});
    t.push_back({tensor_role::w3, l, c.hidden_dim, c.dim, p + "ffn_up.weight", false});
  }
  t.push_back({tensor_role::final_norm, -1, 1, c.dim, "output_norm.weight", true});
  if (!s.shared_classifier) t.push_back({tensor_role::classifier, -1, c.vocab_size, c.dim, "output.weight", false});
  return t;
}

// Symmetric int8 quantization of n values with one scale: q = round(x / d), d = max|x| / 127.
float quantize_group(const float* x, int32_t n, int8_t* q) {
  float amax = 0.0f;
  for (int32_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int32_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::lround(x[i] * id));
  return d;
}

uint64_t gguf_tensor_bytes(dtype t, int64_t rows, int64_t cols) {
  switch (t) {
    case dtype::f32: return rows * cols * 4;
    case dtype::f16: case dtype::bf16: return rows * cols * 2;
    case dtype::q8_0: return rows * (cols / 32) * 34;
  }
  return 0;
}

void write_gguf_row(file_out& f, dtype t, const float* x, int32_t cols) {
  switch (t) {
    case dtype::f32: f.bytes(x, sizeof(float) * cols); break;
    case dtype::f16:
      for (int32_t i = 0; i < cols; ++i) f.pod(f32_to_f16(x[i]));
      break;
    case dtype::bf16:
      for (int32_t i = 0; i < cols; ++i) f.pod(f32_to_bf16(x[i]));
      break;
    case dtype::q8_0:
      for (int32_t g = 0; g < cols / 32; ++g) {
        int8_t q[32];
        const float d = quantize_group(x + g * 32, 32, q);
        const uint16_t dh = f32_to_f16(d);
        // Quantize against the scale as stored, so dequantization uses the same value.
        const float ds = f16_to_f32(dh);
        const float id = ds != 0.0f ? 1.0f / ds : 0.0f;
        for (int i = 0; i < 32; ++i)
          q[i] = static_cast<int8_t>(std::max(-127L, std::min(127L, std::lround(x[g * 32 + i] * id))));
        f.pod(dh);
        f.bytes(q, 32);
      }
      break;
  }
}


// Metadata keys of the rope scaling and the sliding window, under the architecture's prefix.
void gguf_rope_keys(const model_config& c, const std::string& a, std::vector<std::function<void(file_out&)>>& kv) {
  const rope_scaling s = c.rope_scale;
  if (s.type == rope_scaling_type::linear || s.type == rope_scaling_type::yarn) {
    kv.push_back([a, s](file_out& f) { gguf_kv_string(f, a + ".rope.scaling.type", rope_scaling_name(s.type)); });
    kv.push_back([a, s](file_out& f) { gguf_kv_f32(f, a + ".rope.scaling.factor", s.factor); });
  }
  if (s.type == rope_scaling_type::yarn) {
    kv.push_back([a, s](file_out& f) { gguf_kv_u32(f, a + ".rope.scaling.original_context_length", s.original_context); });
    kv.push_back([a, s](file_out& f) { gguf_kv_f32(f, a + ".rope.scaling.yarn_beta_fast", s.beta_fast); });
    kv.push_back([a, s](file_out& f) { gguf_kv_f32(f, a + ".rope.scaling.yarn_beta_slow", s.beta_slow); });
    if (s.attention_factor > 0)
      kv.push_back([a, s](file_out& f) { gguf_kv_f32(f, a + ".rope.scaling.attn_factor", s.attention_factor); });
  }
  if (c.sliding_window > 0)
    kv.push_back([a, w = c.sliding_window](file_out& f) { gguf_kv_u32(f, a + ".attention.sliding_window", w); });
}

int32_t gguf_token_type(token_kind k) {
  switch (k) {
    case token_kind::normal: return 1;
    case token_kind::unknown: return 2;
    case token_kind::control: return 3;
    case token_kind::user_defined: return 4;
    case token_kind::unused: return 5;
    case token_kind::byte: return 6;
  }
  return 1;
}

}  // namespace

status write_llama2c(const std::string& path, const checkpoint_spec& spec, const weight_source& src_in,
                     const std::function<void(double)>& progress) {
  model_config c = spec.config;
  if (auto e = validate(c)) return error{"invalid model shape: " + *e};
  if (c.qkv_bias || c.sliding_window > 0 || c.rope_scale.type != rope_scaling_type::none ||
      !c.rope_freq_factors.empty() || c.q_dim() != c.dim || c.rope_base != 10000.0f || c.rope_dim != c.head_dim)
    return error{"a llama2.c checkpoint holds Llama 2 shapes only (no biases, sliding window, rope scaling, "
                 "other rope base or head size); write GGUF or a Hugging Face directory"};
  if (spec.type != dtype::f32 && spec.type != dtype::q8_0)
    return error{"llama2.c checkpoints hold f32 (legacy) or q8_0 (version 2) weights, not " + std::string(dtype_name(spec.type))};
  const bool q8 = spec.type == dtype::q8_0;
  const int32_t gs = spec.group_size;
  if (q8 && (gs <= 0 || c.dim % gs != 0 || c.hidden_dim % gs != 0))
    return error{"Q8_0 group size " + std::to_string(gs) + " must divide dim and hidden_dim"};
  const weight_source src_pairs = with_rope_layout(src_in, c, c.rope, rope_layout::pairs);
  const weight_source& src = src_pairs;
  file_out f(path);
  const int32_t header[7] = {c.dim, c.hidden_dim, c.num_layers, c.num_heads, c.num_kv_heads,
                             spec.shared_classifier || q8 ? c.vocab_size : -c.vocab_size, c.max_seq_len};
  if (q8) {
    f.pod(uint32_t{0x616b3432});
    f.pod(int32_t{2});
    f.bytes(header, sizeof header);
    f.pod(static_cast<uint8_t>(spec.shared_classifier));
    f.pod(gs);
    f.pad_to(256);
  } else {
    f.bytes(header, sizeof header);
  }
  std::vector<float> row(std::max(c.dim, c.hidden_dim));
  const double total_rows = double(c.vocab_size) * (spec.shared_classifier ? 1 : 2) +
                            double(c.num_layers) * (2.0 * c.dim + 2.0 * c.kv_dim() + 3.0 * c.hidden_dim);
  double done_rows = 0;
  auto dense = [&](tensor_role role, int32_t layer, int32_t rows, int32_t cols) {
    for (int32_t r = 0; r < rows; ++r) {
      src(role, layer, r, row.data(), cols);
      f.bytes(row.data(), sizeof(float) * cols);
    }
    if (cols > 1 && rows > 1) done_rows += rows;
    if (progress && rows > 1) progress(done_rows / total_rows);
  };
  auto quant = [&](tensor_role role, int32_t layer, int32_t rows, int32_t cols) {
    std::vector<float> scales;
    std::vector<int8_t> q(cols);
    for (int32_t r = 0; r < rows; ++r) {
      src(role, layer, r, row.data(), cols);
      for (int32_t g = 0; g < cols / gs; ++g) scales.push_back(quantize_group(row.data() + g * gs, gs, q.data() + g * gs));
      f.bytes(q.data(), cols);
    }
    f.bytes(scales.data(), sizeof(float) * scales.size());
    done_rows += rows;
    if (progress) progress(done_rows / total_rows);
  };
  const int32_t L = c.num_layers;
  if (!q8) {
    dense(tensor_role::embedding, -1, c.vocab_size, c.dim);
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::attn_norm, l, 1, c.dim);
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::wq, l, c.dim, c.dim);
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::wk, l, c.kv_dim(), c.dim);
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::wv, l, c.kv_dim(), c.dim);
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::wo, l, c.dim, c.dim);
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::ffn_norm, l, 1, c.dim);
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::w1, l, c.hidden_dim, c.dim);
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::w2, l, c.dim, c.hidden_dim);
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::w3, l, c.hidden_dim, c.dim);
    dense(tensor_role::final_norm, -1, 1, c.dim);
    // The legacy format still carries two RoPE tables that readers skip.
    std::vector<float> zeros(int64_t{c.max_seq_len} * (c.head_dim / 2) * 2, 0.0f);
    f.bytes(zeros.data(), sizeof(float) * zeros.size());
    if (!spec.shared_classifier) dense(tensor_role::classifier, -1, c.vocab_size, c.dim);
  } else {
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::attn_norm, l, 1, c.dim);
    for (int32_t l = 0; l < L; ++l) dense(tensor_role::ffn_norm, l, 1, c.dim);
    dense(tensor_role::final_norm, -1, 1, c.dim);
    quant(tensor_role::embedding, -1, c.vocab_size, c.dim);
    for (int32_t l = 0; l < L; ++l) quant(tensor_role::wq, l, c.dim, c.dim);
    for (int32_t l = 0; l < L; ++l) quant(tensor_role::wk, l, c.kv_dim(), c.dim);
    for (int32_t l = 0; l < L; ++l) quant(tensor_role::wv, l, c.kv_dim(), c.dim);
    for (int32_t l = 0; l < L; ++l) quant(tensor_role::wo, l, c.dim, c.dim);
    for (int32_t l = 0; l < L; ++l) quant(tensor_role::w1, l, c.hidden_dim, c.dim);
    for (int32_t l = 0; l < L; ++l) quant(tensor_role::w2, l, c.dim, c.hidden_dim);
    for (int32_t l = 0; l < L; ++l) quant(tensor_role::w3, l, c.hidden_dim, c.dim);
    if (!spec.shared_classifier) quant(tensor_role::classifier, -1, c.vocab_size, c.dim);
  }
  return f.close();
}

status write_gguf(const std::string& path, const checkpoint_spec& spec, const vocabulary& vocab,
                  const weight_source& src_in, const std::function<void(double)>& progress,
                  const std::string& chat_template) {
  model_config c = spec.config;
  if (auto e = validate(c)) return error{"invalid model shape: " + *e};
  if (vocab.size() != c.vocab_size)
    return error{"the vocabulary has " + std::to_string(vocab.size()) + " tokens, the model " + std::to_string(c.vocab_size)};
  if (spec.type == dtype::q8_0 && (c.dim % 32 != 0 || c.hidden_dim % 32 != 0))
    return error{"GGUF Q8_0 needs dim and hidden_dim to be multiples of 32"};
  checkpoint_spec validated = spec;
  validated.config = c;
  auto tensors = gguf_tensors(validated);
  const std::string a = gguf_arch(c.family);
  const std::vector<float> freq_factors =
      c.rope_scale.type == rope_scaling_type::llama3 ? llama3_freq_factors(c) : c.rope_freq_factors;
  if (!freq_factors.empty())
    tensors.push_back({tensor_role::final_norm, -1, 1, c.rope_dim / 2, "rope_freqs.weight", true, &freq_factors});
  const weight_source src = with_rope_layout(src_in, c, c.rope, gguf_rope(c.family));
  constexpr uint64_t alignment = 32;
  file_out f(path);
  f.pod(uint32_t{0x46554747});
  f.pod(uint32_t{3});
  f.pod(static_cast<uint64_t>(tensors.size()));
  // Metadata entries, counted before they are written.
  std::vector<std::function<void()>> kv;
  auto add = [&](std::function<void()> fn) { kv.push_back(std::move(fn)); };
  add([&] { gguf_kv_string(f, "general.architecture", a); });
  add([&] { gguf_kv_string(f, "general.name", "troupe synthetic"); });
  add([&] { gguf_kv_u32(f, "general.alignment", alignment); });
  add([&] { gguf_kv_u32(f, a + ".context_length", c.max_seq_len); });
  add([&] { gguf_kv_u32(f, a + ".embedding_length", c.dim); });
  add([&] { gguf_kv_u32(f, a + ".feed_forward_length", c.hidden_dim); });
  add([&] { gguf_kv_u32(f, a + ".block_count", c.num_layers); });
  add([&] { gguf_kv_u32(f, a + ".attention.head_count", c.num_heads); });
  add([&] { gguf_kv_u32(f, a + ".attention.head_count_kv", c.num_kv_heads); });
  if (c.head_dim * c.num_heads != c.dim) {
    add([&] { gguf_kv_u32(f, a + ".attention.key_length", c.head_dim); });
    add([&] { gguf_kv_u32(f, a + ".attention.value_length", c.head_dim); });
  }
  add([&] { gguf_kv_u32(f, a + ".rope.dimension_count", c.rope_dim); });
  add([&] { gguf_kv_f32(f, a + ".rope.freq_base", c.rope_base); });
  add([&] { gguf_kv_f32(f, a + ".attention.layer_norm_rms_epsilon", c.rms_eps); });
  std::vector<std::function<void(file_out&)>> rope_keys;
  gguf_rope_keys(c, a, rope_keys);
  for (auto& k : rope_keys) add([&f, &k] { k(f); });
  const bool byte_level = vocab.style == vocab_style::byte_level;
  add([&] { gguf_kv_string(f, "tokenizer.ggml.model", byte_level ? "gpt2" : "llama"); });
  if (byte_level) {
    // The pre-tokenizer by llama.cpp's name for its pattern.
    const std::string pre = vocab.pattern == llama3_pattern  ? "llama-bpe"
                            : vocab.pattern == qwen2_pattern ? "qwen2"
                                                             : "gpt-2";
    add([&f, pre] { gguf_kv_string(f, "tokenizer.ggml.pre", pre); });
  }
  if (!chat_template.empty()) add([&] { gguf_kv_string(f, "tokenizer.chat_template", chat_template); });
  add([&] {  // tokens, with spaces as SentencePiece's U+2581, or through GPT-2's byte table
    f.str("tokenizer.ggml.tokens");
    f.pod(uint32_t{9});
    f.pod(uint32_t{8});
    f.pod(static_cast<uint64_t>(vocab.size()));
    for (int32_t i = 0; i < vocab.size(); ++i) {
      const std::string& p = vocab.pieces[i];
      if (byte_level) {
        f.str(vocab.kinds[i] == token_kind::normal ? byte_level_encode(p) : p);
        continue;
      }
      std::string s;
      for (char ch : p) s += ch == ' ' ? std::string("\xe2\x96\x81") : std::string(1, ch);
      f.str(s);
    }
  });
  if (byte_level) {
    add([&] {
      f.str("tokenizer.ggml.merges");
      f.pod(uint32_t{9});
      f.pod(uint32_t{8});
      f.pod(static_cast<uint64_t>(vocab.merges.size()));
      for (const auto& [a, b] : vocab.merges)
        f.str(byte_level_encode(vocab.pieces[a]) + " " + byte_level_encode(vocab.pieces[b]));
    });
  } else {
    add([&] {
      f.str("tokenizer.ggml.scores");
      f.pod(uint32_t{9});
      f.pod(uint32_t{6});
      f.pod(static_cast<uint64_t>(vocab.size()));
      for (float s : vocab.scores) f.pod(s);
    });
  }
  add([&] {
    f.str("tokenizer.ggml.token_type");
    f.pod(uint32_t{9});
    f.pod(uint32_t{5});
    f.pod(static_cast<uint64_t>(vocab.size()));
    for (token_kind k : vocab.kinds) f.pod(gguf_token_type(k));
  });
  add([&] { gguf_kv_u32(f, "tokenizer.ggml.bos_token_id", vocab.bos_id); });
  add([&] { gguf_kv_u32(f, "tokenizer.ggml.eos_token_id", vocab.eos_id); });
  if (!byte_level) add([&] { gguf_kv_u32(f, "tokenizer.ggml.unknown_token_id", vocab.unk_id); });
  add([&] { gguf_kv_bool(f, "tokenizer.ggml.add_space_prefix", vocab.add_space_prefix); });
  add([&] { gguf_kv_bool(f, "tokenizer.ggml.add_bos_token", vocab.add_bos); });
  f.pod(static_cast<uint64_t>(kv.size()));
  for (auto& fn : kv) fn();

  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const dtype type = t.is_norm ? dtype::f32 : spec.type;
    f.str(t.gguf_name);
    if (t.is_norm) {
      f.pod(uint32_t{1});
      f.pod(static_cast<uint64_t>(t.cols));
    } else {
      f.pod(uint32_t{2});
      f.pod(static_cast<uint64_t>(t.cols));
      f.pod(static_cast<uint64_t>(t.rows));
    }
    const uint32_t ggml = type == dtype::f32 ? 0 : type == dtype::f16 ? 1 : type == dtype::q8_0 ? 8 : 30;
    f.pod(ggml);
    f.pod(offset);
    offset += (gguf_tensor_bytes(type, t.rows, t.cols) + alignment - 1) / alignment * alignment;
  }
  f.pad_to(alignment);
  std::vector<float> row(std::max({c.dim, c.hidden_dim, c.q_dim()}));
  double done = 0, total = 0;
  for (const auto& t : tensors) total += t.rows;
  for (const auto& t : tensors) {
    const dtype type = t.is_norm ? dtype::f32 : spec.type;
    for (int32_t r = 0; r < t.rows; ++r) {
      if (t.fixed)
        std::copy(t.fixed->begin(), t.fixed->end(), row.begin());
      else
        src(t.role, t.layer, r, row.data(), t.cols);
      write_gguf_row(f, type, row.data(), t.cols);
    }
    f.pad_to(alignment);
    done += t.rows;
    if (progress) progress(done / total);
  }
  return f.close();
}

vocabulary synthetic_vocabulary(int32_t n) {
  vocabulary v;
  v.pieces = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.pieces.push_back(buf);
  }
  // Printable characters, then " " + character, then two-character pieces.
  for (int ch = 32; ch < 127 && v.size() < n; ++ch) v.pieces.push_back(std::string(1, static_cast<char>(ch)));
  for (int ch = 33; ch < 127 && v.size() < n; ++ch) v.pieces.push_back(std::string{' ', static_cast<char>(ch)});
  for (int a = 97; a < 123 && v.size() < n; ++a)
    for (int b = 97; b < 123 && v.size() < n; ++b)
      v.pieces.push_back(std::string{static_cast<char>(a), static_cast<char>(b)});
  for (int32_t i = 0; v.size() < n; ++i) v.pieces.push_back("<extra_" + std::to_string(i) + ">");
  v.pieces.resize(n);
  v.scores.resize(n);
  for (int32_t i = 0; i < n; ++i) v.scores[i] = i < 259 ? 0.0f : -static_cast<float>(i);
  if (auto e = validate(v)) v.pieces.clear();
  return v;
}

status write_llama2c_vocabulary(const std::string& path, const vocabulary& v) {
  file_out f(path);
  int32_t max_len = 1;
  for (const auto& p : v.pieces) max_len = std::max<int32_t>(max_len, static_cast<int32_t>(p.size()));
  f.pod(max_len);
  for (int32_t i = 0; i < v.size(); ++i) {
    f.pod(v.scores[i]);
    f.pod(static_cast<int32_t>(v.pieces[i].size()));
    f.bytes(v.pieces[i].data(), v.pieces[i].size());
  }
  return f.close();
}

}  // namespace troupe
