// llama2.c checkpoints.
//
// Legacy (version 0): seven int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size, seq_len; a negative vocab_size means a separate classifier follows), then
// f32 arrays: token embedding [vocab][dim], rms_att [L][dim], wq [L][dim][dim],
// wk [L][kv_dim][dim], wv [L][kv_dim][dim], wo [L][dim][dim], rms_ffn [L][dim],
// w1 [L][hidden][dim], w2 [L][dim][hidden], w3 [L][hidden][dim], rms_final [dim],
// two unused RoPE tables [seq_len][head_dim/2], and the classifier [vocab][dim] if separate.
//
// Version 2: a 256-byte header (u32 magic "ak42", i32 version 2, the seven int32 above,
// u8 shared_classifier, i32 group_size), f32 norms (rms_att [L][dim], rms_ffn [L][dim],
// rms_final [dim]), then Q8_0 tensors, each as int8 values followed by one f32 scale per
// group of group_size: token embedding, wq, wk, wv, wo, w1, w2, w3 (each per layer), and
// the classifier unless shared.
#include <climits>
#include <cstring>

#include "engine/model/model.hpp"

namespace troupe {

namespace {

constexpr uint32_t magic_ak42 = 0x616b3432;

struct header7 {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

// Hands out consecutive regions of the file, checking each against its end.
class region_cursor {
 public:
  region_cursor(const mapped_file& f, size_t start) : f_(f), pos_(start) {}
  const uint8_t* take(int64_t bytes, const char* what) {
    if (!ok_) return nullptr;
    if (bytes < 0 || static_cast<uint64_t>(bytes) > f_.size() - pos_) {
      ok_ = false;
      error_ = f_.path() + ": truncated: " + what + " needs " + std::to_string(bytes) +
               " bytes at offset " + std::to_string(pos_) + ", the file has " +
               std::to_string(f_.size()) + " bytes in all";
      return nullptr;
    }
    const uint8_t* p = f_.data() + pos_;
    pos_ += static_cast<size_t>(bytes);
    return p;
  }
  bool ok() const { return ok_; }
  size_t pos() const { return pos_; }
  const std::string& error_message() const { return error_; }

 private:
  const mapped_file& f_;
  size_t pos_;
  bool ok_ = true;
  std::string error_;
};

expected<model_config> config_from(const header7& h, const std::string& path) {
  model_config c;
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.num_layers = h.n_layers;
  c.num_heads = h.n_heads;
  c.num_kv_heads = h.n_kv_heads;
  // A negative size flags a separate classifier; INT32_MIN has no magnitude and fails validation.
  c.vocab_size = h.vocab_size == INT32_MIN ? 0 : h.vocab_size < 0 ? -h.vocab_size : h.vocab_size;
  c.max_seq_len = h.seq_len;
  c.rope_base = 10000.0f;
  c.rms_eps = 1e-5f;
  c.rope = rope_layout::pairs;
  if (auto e = validate(c))
    return error{path + ": header describes an impossible model: " + *e +
                 " (is this a llama2.c checkpoint?)"};
  return c;
}

matrix_view f32_matrix(const uint8_t* p, int32_t rows, int32_t cols) {
  return matrix_view::dense(dtype::f32, p, rows, cols);
}

matrix_view q8_matrix(const uint8_t* q, const uint8_t* s, int32_t rows, int32_t cols, int32_t gs) {
  matrix_view v;
  v.type = dtype::q8_0;
  v.rows = rows;
  v.cols = cols;
  v.group_size = gs;
  v.q = reinterpret_cast<const int8_t*>(q);
  v.q_row_stride = cols;
  v.q_group_stride = gs;
  v.scale = s;
  v.s_row_stride = int64_t{cols / gs} * 4;
  v.s_group_stride = 4;
  v.scale_is_f16 = false;
  return v;
}

expected<model> load_v0(mapped_file file) {
  const std::string path = file.path();
  header7 h{};
  if (file.size() < sizeof h) return error{path + ": truncated: shorter than a llama2.c header"};
  std::memcpy(&h, file.data(), sizeof h);
  auto cfg = config_from(h, path);
  if (!cfg) return cfg.err();
  const model_config& c = *cfg;
  const bool shared = h.vocab_size > 0;
  const int64_t d = c.dim, L = c.num_layers, kv = c.kv_dim(), hid = c.hidden_dim,
                V = c.vocab_size, hd = c.head_dim;
  const int64_t floats = V * d + L * d + L * d * d + 2 * L * kv * d + L * d * d + L * d +
                         3 * L * hid * d + d + 2 * int64_t{c.max_seq_len} * (hd / 2) +
                         (shared ? 0 : V * d);
  const int64_t expected_size = static_cast<int64_t>(sizeof h) + 4 * floats;
  if (static_cast<int64_t>(file.size()) != expected_size)
    return error{path + ": " + (static_cast<int64_t>(file.size()) < expected_size ? "truncated: " : "") +
                 "the header (" + describe(c) + (shared ? ", shared classifier" : ", separate classifier") +
                 ") needs " + std::to_string(expected_size) + " bytes, the file has " +
                 std::to_string(file.size())};

  model m;
  m.path = path;
  m.format = "llama2.c v0 (f32)";
  m.weight_type = dtype::f32;
  m.config = c;
  region_cursor cur(file, sizeof h);
  auto& w = m.weights;
  w.token_embedding = f32_matrix(cur.take(V * d * 4, "token embedding"), c.vocab_size, c.dim);
  w.layers.resize(c.num_layers);
  const uint8_t* rms_att = cur.take(L * d * 4, "rms_att");
  const uint8_t* wq = cur.take(L * d * d * 4, "wq");
  const uint8_t* wk = cur.take(L * kv * d * 4, "wk");
  const uint8_t* wv = cur.take(L * kv * d * 4, "wv");
  const uint8_t* wo = cur.take(L * d * d * 4, "wo");
  const uint8_t* rms_ffn = cur.take(L * d * 4, "rms_ffn");
  const uint8_t* w1 = cur.take(L * hid * d * 4, "w1");
  const uint8_t* w2 = cur.take(L * d * hid * 4, "w2");
  const uint8_t* w3 = cur.take(L * hid * d * 4, "w3");
  const uint8_t* rms_final = cur.take(d * 4, "rms_final");
  cur.take(2 * int64_t{c.max_seq_len} * (hd / 2) * 4, "rope tables");
  const uint8_t* wcls = shared ? nullptr : cur.take(V * d * 4, "classifier");
  if (!cur.ok()) return error{cur.error_message()};
  for (int64_t l = 0; l < L; ++l) {
    auto& lw = w.layers[l];
    lw.attn_norm = reinterpret_cast<const float*>(rms_att) + l * d;
    lw.ffn_norm = reinterpret_cast<const float*>(rms_ffn) + l * d;
    lw.wq = f32_matrix(wq + l * d * d * 4, c.dim, c.dim);
    lw.wk = f32_matrix(wk + l * kv * d * 4, c.kv_dim(), c.dim);
    lw.wv = f32_matrix(wv + l * kv * d * 4, c.kv_dim(), c.dim);
    lw.wo = f32_matrix(wo + l * d * d * 4, c.dim, c.dim);
    lw.w1 = f32_matrix(w1 + l * hid * d * 4, c.hidden_dim, c.dim);
    lw.w2 = f32_matrix(w2 + l * d * hid * 4, c.dim, c.hidden_dim);
    lw.w3 = f32_matrix(w3 + l * hid * d * 4, c.hidden_dim, c.dim);
  }
  w.final_norm = reinterpret_cast<const float*>(rms_final);
  w.classifier = shared ? w.token_embedding : f32_matrix(wcls, c.vocab_size, c.dim);
  w.file = std::move(file);
  return m;
}

expected<model> load_v2(mapped_file file) {
  const std::string path = file.path();
  constexpr size_t header_size = 256;
  if (file.size() < header_size) return error{path + ": truncated: shorter than the 256-byte version 2 header"};
  int32_t version = 0;
  std::memcpy(&version, file.data() + 4, 4);
  if (version != 2)
    return error{path + ": llama2.c checkpoint version " + std::to_string(version) +
                 " is not supported (0 and 2 are)"};
  header7 h{};
  std::memcpy(&h, file.data() + 8, sizeof h);
  const uint8_t shared_flag = file.data()[8 + sizeof h];
  int32_t gs = 0;
  std::memcpy(&gs, file.data() + 8 + sizeof h + 1, 4);
  auto cfg = config_from(h, path);
  if (!cfg) return cfg.err();
  const model_config& c = *cfg;
  if (shared_flag > 1) return error{path + ": shared_classifier flag is " + std::to_string(shared_flag)};
  const bool shared = shared_flag == 1;
  if (gs <= 0 || c.dim % gs != 0 || c.hidden_dim % gs != 0)
    return error{path + ": group size " + std::to_string(gs) + " does not divide dim " +
                 std::to_string(c.dim) + " and hidden_dim " + std::to_string(c.hidden_dim)};

  const int64_t d = c.dim, L = c.num_layers, kv = c.kv_dim(), hid = c.hidden_dim, V = c.vocab_size;
  auto q8_bytes = [gs](int64_t n) { return n + n / gs * 4; };
  const int64_t expected_size =
      static_cast<int64_t>(header_size) + 4 * (2 * L * d + d) + q8_bytes(V * d) +
      L * (q8_bytes(d * d) * 2 + q8_bytes(kv * d) * 2 + q8_bytes(hid * d) * 3) +
      (shared ? 0 : q8_bytes(V * d));
  if (static_cast<int64_t>(file.size()) != expected_size)
    return error{path + ": " + (static_cast<int64_t>(file.size()) < expected_size ? "truncated: " : "") +
                 "the header (" + describe(c) + ", Q8_0 group size " + std::to_string(gs) +
                 ") needs " + std::to_string(expected_size) + " bytes, the file has " +
                 std::to_string(file.size())};

  model m;
  m.path = path;
  m.format = "llama2.c v2 (q8_0, group size " + std::to_string(gs) + ")";
  m.weight_type = dtype::q8_0;
  m.config = c;
  region_cursor cur(file, header_size);
  const uint8_t* rms_att = cur.take(L * d * 4, "rms_att");
  const uint8_t* rms_ffn = cur.take(L * d * 4, "rms_ffn");
  const uint8_t* rms_final = cur.take(d * 4, "rms_final");
  auto take_q8 = [&](int32_t rows, int32_t cols, const char* what) {
    const int64_t n = int64_t{rows} * cols;
    const uint8_t* q = cur.take(n, what);
    const uint8_t* s = cur.take(n / gs * 4, what);
    return q8_matrix(q, s, rows, cols, gs);
  };
  auto& w = m.weights;
  w.token_embedding = take_q8(c.vocab_size, c.dim, "token embedding");
  w.layers.resize(c.num_layers);
  for (auto& l : w.layers) l.wq = take_q8(c.dim, c.dim, "wq");
  for (auto& l : w.layers) l.wk = take_q8(c.kv_dim(), c.dim, "wk");
  for (auto& l : w.layers) l.wv = take_q8(c.kv_dim(), c.dim, "wv");
  for (auto& l : w.layers) l.wo = take_q8(c.dim, c.dim, "wo");
  for (auto& l : w.layers) l.w1 = take_q8(c.hidden_dim, c.dim, "w1");
  for (auto& l : w.layers) l.w2 = take_q8(c.dim, c.hidden_dim, "w2");
  for (auto& l : w.layers) l.w3 = take_q8(c.hidden_dim, c.dim, "w3");
  w.classifier = shared ? w.token_embedding : take_q8(c.vocab_size, c.dim, "classifier");
  if (!cur.ok()) return error{cur.error_message()};
  for (int64_t l = 0; l < L; ++l) {
    w.layers[l].attn_norm = reinterpret_cast<const float*>(rms_att) + l * d;
    w.layers[l].ffn_norm = reinterpret_cast<const float*>(rms_ffn) + l * d;
  }
  w.final_norm = reinterpret_cast<const float*>(rms_final);
  w.file = std::move(file);
  return m;
}

}  // namespace

expected<model> load_llama2c(mapped_file file) {
  if (file.size() >= 4) {
    uint32_t magic = 0;
    std::memcpy(&magic, file.data(), 4);
    if (magic == magic_ak42) return load_v2(std::move(file));
  }
  return load_v0(std::move(file));
}

}  // namespace troupe
