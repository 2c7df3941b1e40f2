#include "engine/speculative/heads.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "engine/model/file_out.hpp"
#include "engine/model/gguf_file.hpp"
#include "engine/speculative/speculative.hpp"

namespace troupe {

namespace {

constexpr const char* medusa_arch = "troupe.medusa";
constexpr const char* eagle_arch = "troupe.eagle";
constexpr int32_t max_medusa_heads = max_draft_tokens;
constexpr int32_t max_medusa_blocks = 8;
constexpr uint32_t heads_alignment = 32;

std::string layers_text(int64_t n) { return std::to_string(n) + (n == 1 ? " layer" : " layers"); }

std::string shape_text(const std::vector<uint64_t>& dims) {  // GGUF order, shown outermost first
  std::string s = "[";
  for (size_t i = dims.size(); i-- > 0;) s += std::to_string(dims[i]) + (i ? " x " : "");
  return s + "]";
}

// Reads tensors of a head file, each checked: present, F32, of the shape wanted.
class head_tensors {
 public:
  head_tensors(const gguf_file& f, const std::string& path) : f_(f), path_(path) {}

  const std::string& problem() const { return problem_; }

  matrix_view matrix(const std::string& name, int64_t rows, int64_t cols) {
    matrix_view m;
    const gguf_tensor* t = find(name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)});
    if (!t) return m;
    m.type = dtype::f32;
    m.rows = static_cast<int32_t>(rows);
    m.cols = static_cast<int32_t>(cols);
    m.data = t->data;
    m.row_stride = cols;
    return m;
  }
  const float* vector(const std::string& name, int64_t n) {
    const gguf_tensor* t = find(name, {static_cast<uint64_t>(n)});
    return t ? reinterpret_cast<const float*>(t->data) : nullptr;
  }
  bool has(const std::string& name) const { return f_.tensor(name) != nullptr; }
  // After every tensor wanted is read: the first one the file holds besides.
  std::string unexpected() const {
    for (const gguf_tensor& t : f_.tensors())
      if (!read_.count(t.name)) return t.name;
    return "";
  }
  // The rows of a [rows][cols] tensor whose rows are free (a FFN's width), 0 if absent.
  int64_t rows_of(const std::string& name) const {
    const gguf_tensor* t = f_.tensor(name);
    return t && t->dims.size() == 2 ? static_cast<int64_t>(t->dims[1]) : 0;
  }

 private:
  const gguf_tensor* find(const std::string& name, const std::vector<uint64_t>& dims) {
    if (!problem_.empty()) return nullptr;
    const gguf_tensor* t = f_.tensor(name);
    if (!t) {
      problem_ = path_ + ": tensor " + name + " is missing";
      return nullptr;
    }
    if (t->ggml_type != ggml_f32) {
      problem_ = path_ + ": tensor " + name + " is not F32 (head files hold F32 tensors)";
      return nullptr;
    }
    if (t->dims != dims) {
      problem_ = path_ + ": tensor " + name + " is " + shape_text(t->dims) + "; this model needs " + shape_text(dims);
      return nullptr;
    }
    read_.insert(name);
    return t;
  }

  const gguf_file& f_;
  std::string path_;
  std::string problem_;
  std::set<std::string> read_;
};

}  // namespace

int32_t speculative_heads::depth() const {
  return kind == heads_kind::medusa ? static_cast<int32_t>(medusa.size()) : max_draft_tokens;
}

std::string speculative_heads::describe() const {
  if (kind == heads_kind::medusa) {
    const size_t blocks = medusa.empty() ? 0 : medusa[0].blocks.size();
    const bool own = !medusa.empty() && medusa[0].classifier;
    return std::to_string(medusa.size()) + " Medusa heads (" + std::to_string(blocks) + " residual block" +
           (blocks == 1 ? "" : "s") + " and " + (own ? "a classifier" : "the model's classifier") + " each)";
  }
  return "an EAGLE layer (FFN " + std::to_string(eagle.gate.rows) + ")";
}

std::string vocabulary_fingerprint(const vocabulary& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](unsigned char c) { h = (h ^ c) * 0x100000001b3ull; };
  for (const std::string& p : v.pieces) {
    for (char c : p) mix(static_cast<unsigned char>(c));
    mix(0xff);  // no piece holds this byte alone at its end: pieces stay apart
  }
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

expected<std::unique_ptr<speculative_heads>> load_heads(const std::string& path, const model& target,
                                                        const vocabulary* target_vocab) {
  auto mapped = mapped_file::open(path);
  if (!mapped) return mapped.err();
  return load_heads(std::move(*mapped), target, target_vocab);
}

expected<std::unique_ptr<speculative_heads>> load_heads(mapped_file file, const model& target,
                                                        const vocabulary* target_vocab) {
  const std::string path = file.path();
  auto parsed = gguf_file::parse(std::move(file));
  if (!parsed) return error{parsed.err().message + " (a head file is a GGUF file that troupe-train writes)"};
  gguf_file& f = *parsed;
  const std::string arch = f.get_string("general.architecture").value_or("");
  if (arch != medusa_arch && arch != eagle_arch)
    return error{path + " is not a head file: its architecture is '" + arch + "', not " + medusa_arch + " or " +
                 eagle_arch + (arch.empty() ? "" : " (a model goes to --draft)")};

  const model_config& c = target.config;
  const auto dim = f.get_int("troupe.target.dim"), vocab = f.get_int("troupe.target.vocab_size"),
             layers = f.get_int("troupe.target.layers");
  if (!dim || !vocab || !layers) return error{path + ": the file does not name its target model (troupe.target.*)"};
  if (*dim != c.dim || *vocab != c.vocab_size || *layers != c.num_layers)
    return error{path + ": heads trained for another model: theirs has dim " + std::to_string(*dim) + ", " +
                 layers_text(*layers) + ", vocabulary " + std::to_string(*vocab) + "; this one has dim " +
                 std::to_string(c.dim) + ", " + layers_text(c.num_layers) + ", vocabulary " +
                 std::to_string(c.vocab_size)};
  if (target_vocab) {
    const std::string want = f.get_string("troupe.target.vocabulary").value_or("");
    if (want != vocabulary_fingerprint(*target_vocab))
      return error{path + ": heads trained for a model with another vocabulary (as many tokens, other texts)"};
  }

  auto h = std::make_unique<speculative_heads>();
  h->path = path;
  head_tensors t(f, path);
  if (arch == medusa_arch) {
    h->kind = heads_kind::medusa;
    const int64_t heads = f.get_int("medusa.head_count").value_or(0);
    const int64_t blocks = f.get_int("medusa.block_count").value_or(0);
    if (heads < 1 || heads > max_medusa_heads)
      return error{path + ": medusa.head_count must be 1.." + std::to_string(max_medusa_heads)};
    if (blocks < 1 || blocks > max_medusa_blocks)
      return error{path + ": medusa.block_count must be 1.." + std::to_string(max_medusa_blocks)};
    h->medusa.resize(static_cast<size_t>(heads));
    const bool own = t.has("medusa.0.output.weight");
    for (int64_t i = 0; i < heads; ++i) {
      const std::string head = "medusa." + std::to_string(i);
      for (int64_t j = 0; j < blocks; ++j) {
        const std::string p = head + "." + std::to_string(j);
        h->medusa[i].blocks.push_back({t.matrix(p + ".weight", c.dim, c.dim), t.vector(p + ".bias", c.dim)});
      }
      if (own) h->medusa[i].classifier = t.matrix(head + ".output.weight", c.vocab_size, c.dim);
    }
  } else {
    h->kind = heads_kind::eagle;
    if (c.rope_dim != c.head_dim) return error{path + ": EAGLE heads need a target that rotates whole heads"};
    const int64_t ffn = t.rows_of("eagle.ffn_gate.weight");
    if (ffn < 1 || ffn > max_dim) return error{path + ": tensor eagle.ffn_gate.weight is missing or malformed"};
    eagle_layer& e = h->eagle;
    e.fc = t.matrix("eagle.fc.weight", c.dim, 2 * static_cast<int64_t>(c.dim));
    e.fc_bias = t.vector("eagle.fc.bias", c.dim);
    e.attn_norm = t.vector("eagle.attn_norm.weight", c.dim);
    e.wq = t.matrix("eagle.attn_q.weight", c.q_dim(), c.dim);
    e.wk = t.matrix("eagle.attn_k.weight", c.kv_dim(), c.dim);
    e.wv = t.matrix("eagle.attn_v.weight", c.kv_dim(), c.dim);
    e.wo = t.matrix("eagle.attn_output.weight", c.dim, c.q_dim());
    e.ffn_norm = t.vector("eagle.ffn_norm.weight", c.dim);
    e.gate = t.matrix("eagle.ffn_gate.weight", ffn, c.dim);
    e.up = t.matrix("eagle.ffn_up.weight", ffn, c.dim);
    e.down = t.matrix("eagle.ffn_down.weight", c.dim, ffn);
  }
  if (!t.problem().empty()) return error{t.problem()};
  if (const std::string extra = t.unexpected(); !extra.empty())
    return error{path + ": tensor " + extra + " belongs to no head of this kind"};
  h->file = f.take_file();
  return h;
}


status write_heads(const std::string& path, const safetensors_file& src, const model& target,
                   const vocabulary& target_vocab) {
  std::vector<head_tensor> tensors;
  for (const auto& [name, t] : src.tensors()) {
    if (t.type != dtype::f32) return error{src.path() + ": tensor " + name + " is not F32"};
    tensors.push_back({name, t.shape, reinterpret_cast<const float*>(t.data)});
  }
  if (tensors.empty()) return error{src.path() + ": no tensors"};
  return write_heads(path, tensors, target, target_vocab);
}

status write_heads(const std::string& path, std::span<const head_tensor> tensors, const model& target,
                   const vocabulary& target_vocab) {
  if (tensors.empty()) return error{"no tensors to write"};
  const bool medusa = tensors.front().name.rfind("medusa.", 0) == 0;
  const std::string prefix = medusa ? "medusa." : "eagle.";
  int64_t heads = 0, blocks = 0;
  std::vector<uint64_t> bytes;
  for (const head_tensor& t : tensors) {
    if (t.name.rfind(prefix, 0) != 0)
      return error{"tensor " + t.name + " is neither Medusa's (medusa.*) nor EAGLE's (eagle.*), or they are mixed"};
    if (t.shape.empty() || t.shape.size() > 2) return error{"tensor " + t.name + " is not a vector or matrix"};
    uint64_t n = sizeof(float);
    for (int64_t d : t.shape) {
      if (d < 1 || d > max_vocab) return error{"tensor " + t.name + " has a dimension of " + std::to_string(d)};
      n *= static_cast<uint64_t>(d);
    }
    bytes.push_back(n);
    int head = 0, block = 0;
    if (medusa && std::sscanf(t.name.c_str(), "medusa.%d.%d.", &head, &block) == 2 && head >= 0 && block >= 0) {
      heads = std::max<int64_t>(heads, head + 1);
      blocks = std::max<int64_t>(blocks, block + 1);
    }
  }
  const model_config& c = target.config;
  file_out f(path);
  f.pod(uint32_t{0x46554747});
  f.pod(uint32_t{3});
  f.pod(static_cast<uint64_t>(tensors.size()));
  std::vector<std::function<void()>> kv;
  kv.push_back([&] { gguf_kv_string(f, "general.architecture", medusa ? medusa_arch : eagle_arch); });
  kv.push_back([&] { gguf_kv_u32(f, "general.alignment", heads_alignment); });
  kv.push_back([&] { gguf_kv_u32(f, "troupe.target.dim", static_cast<uint32_t>(c.dim)); });
  kv.push_back([&] { gguf_kv_u32(f, "troupe.target.vocab_size", static_cast<uint32_t>(c.vocab_size)); });
  kv.push_back([&] { gguf_kv_u32(f, "troupe.target.layers", static_cast<uint32_t>(c.num_layers)); });
  kv.push_back([&] { gguf_kv_string(f, "troupe.target.vocabulary", vocabulary_fingerprint(target_vocab)); });
  if (medusa) {
    kv.push_back([&] { gguf_kv_u32(f, "medusa.head_count", static_cast<uint32_t>(heads)); });
    kv.push_back([&] { gguf_kv_u32(f, "medusa.block_count", static_cast<uint32_t>(blocks)); });
  }
  f.pod(static_cast<uint64_t>(kv.size()));
  for (auto& fn : kv) fn();
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const head_tensor& t = tensors[i];
    f.str(t.name);
    f.pod(static_cast<uint32_t>(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) f.pod(static_cast<uint64_t>(t.shape[d]));
    f.pod(uint32_t{ggml_f32});
    f.pod(offset);
    offset += (bytes[i] + heads_alignment - 1) / heads_alignment * heads_alignment;
  }
  f.pad_to(heads_alignment);
  for (size_t i = 0; i < tensors.size(); ++i) {
    f.bytes(tensors[i].data, static_cast<size_t>(bytes[i]));
    f.pad_to(heads_alignment);
  }
  if (auto st = f.close(); !st) return st;
  // Read back as troupe will: a tensor of the wrong shape is found now, not at serving.
  if (auto back = load_heads(path, target, &target_vocab); !back) {
    std::remove(path.c_str());
    return back.err();
  }
  return ok();
}

}  // namespace troupe
