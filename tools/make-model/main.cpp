// make-model: writes Llama checkpoints of any shape with seeded random weights (or
// converts a model troupe can load), in llama2.c or GGUF format, for benchmarks and tests
// at sizes that cannot be shipped.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "engine/model/checkpoint_writer.hpp"
#include "engine/speculative/heads.hpp"
#include "engine/tokenizer/tokenizer_json.hpp"
#include "tools/common/model_loading.hpp"

using namespace troupe;

namespace {

struct preset {
  const char* name;
  int32_t dim, hidden, layers, heads, kv_heads, vocab, context;
};

constexpr preset presets[] = {
    {"260k", 64, 172, 5, 8, 4, 512, 512},
    {"15m", 288, 768, 6, 6, 6, 32000, 256},
    {"110m", 768, 2048, 12, 12, 12, 32000, 1024},
    {"1b", 2048, 5632, 22, 32, 4, 32000, 2048},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "make-model: write a Llama-family checkpoint with seeded random weights, or convert one.\n\n"
      "Formats: llama2c (f32 writes the legacy format, q8_0 version 2), gguf (f32, f16, bf16,\n"
      "q8_0; the vocabulary goes into the file) and hf (a Hugging Face directory: config.json,\n"
      "model.safetensors in f32, f16 or bf16, and the vocabulary as tokenizer.bin). Families:\n"
      "llama2, llama3, qwen2, mistral. The same seed gives the same weights in every format,\n"
      "so formats can be compared against each other.\n\n"
      "Examples:\n"
      "  make-model syn110m.gguf --preset 110m --type q8_0 --vocab-from tokenizer.bin\n"
      "  make-model tiny.bin --dim 64 --hidden 96 --layers 2 --heads 4 --vocab 300\n"
      "  make-model stories.f16.gguf --from stories260K.bin -z tok512.bin --type f16\n"
      "  make-model qwen-tiny --family qwen2 --format hf --dim 128 --hidden 256 --layers 2 --heads 8 --kv-heads 2\n"
      "  make-model stories_q8_g32.bin --from stories260K.bin --type q8_0 --group-size 32 --pad-ffn 192\n",
      "make-model"};
  std::string out, format, type_name = "f32", preset_name, vocab_from, from, from_tokenizer;
  model_config c;
  c.dim = 64;
  c.hidden_dim = 172;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 0;
  c.vocab_size = 512;
  c.max_seq_len = 256;
  uint64_t seed = 42;
  int32_t group_size = 64;
  bool separate = false;
  app.add_option("output", out, "file to write (.bin: llama2c, .gguf: gguf, unless --format says; a directory for hf)")->required();
  app.add_option("--format", format, "llama2c, gguf or hf (a Hugging Face directory: config.json, model.safetensors)")
      ->check(CLI::IsMember({"llama2c", "gguf", "hf"}));
  std::string family = "llama2", scaling;
  app.add_option("--family", family,
                 "llama2; llama3 (GQA, rope base 500000, llama3 rope scaling); qwen2 (q/k/v biases, rope base 1e6); "
                 "mistral (sliding window)")
      ->check(CLI::IsMember({"llama2", "llama3", "qwen2", "mistral"}))->capture_default_str();
  float rope_theta = 0, rope_factor = 0;
  int32_t window = -1, original_context = 0;
  app.add_option("--rope-theta", rope_theta, "rotary base (default: the family's)");
  app.add_option("--rope-scaling", scaling, "none, linear, llama3 or yarn (default: the family's)")
      ->check(CLI::IsMember({"none", "linear", "llama3", "yarn"}));
  app.add_option("--rope-factor", rope_factor, "rope scaling factor (default 8)");
  app.add_option("--original-context", original_context, "llama3 and yarn: the context before scaling (default: a quarter of --context)");
  app.add_option("--sliding-window", window, "mistral: the attention window in tokens (default: a quarter of --context)");
  app.add_option("--type", type_name, "weight type: f32, f16, bf16 or q8_0")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}))->capture_default_str();
  app.add_option("--preset", preset_name, "a named shape: 260k, 15m, 110m (dim 768, hidden 2048, 12 layers, 12 heads, vocab 32000), 1b")
      ->check(CLI::IsMember({"260k", "15m", "110m", "1b"}));
  app.add_option("--dim", c.dim, "residual width")->capture_default_str();
  app.add_option("--hidden", c.hidden_dim, "FFN width")->capture_default_str();
  app.add_option("--layers", c.num_layers, "transformer layers")->capture_default_str();
  app.add_option("--heads", c.num_heads, "query heads (dim must be a multiple of it)")->capture_default_str();
  app.add_option("--kv-heads", c.num_kv_heads, "default: --heads");
  app.add_option("--vocab", c.vocab_size, "vocabulary size")->capture_default_str();
  app.add_option("--context", c.max_seq_len, "context length in tokens")->capture_default_str();
  app.add_option("--seed", seed, "weights' random seed: the same seed, the same file")->capture_default_str();
  app.add_option("--group-size", group_size, "Q8_0 group size of llama2.c version 2 files")->capture_default_str();
  app.add_flag("--separate-classifier", separate, "write an output matrix instead of sharing the embedding");
  app.add_option("--vocab-from", vocab_from,
                 "the vocabulary: a llama2.c tokenizer.bin, or a Hugging Face tokenizer.json (which sets --vocab) "
                 "(default: a synthetic one)");
  app.add_option("--from", from, "convert this model instead of generating weights");
  app.add_option("-z,--tokenizer", from_tokenizer, "tokenizer.bin of the --from model, if it has none");
  int32_t pad_ffn = 0;
  app.add_option("--pad-ffn", pad_ffn,
                 "with --from: widen the FFN to this many columns with zero weights, which changes no output (a Q8_0 "
                 "group size that does not divide the model's FFN then fits: stories260K's 172 to 192 for groups of 32)");
  int32_t damp_from = -1, keep_layers = 0;
  float damp = 0.05f;
  app.add_option("--damp-layers", damp_from,
                 "layers from this one on write to the residual stream scaled by --damp (their wo and w2): a model "
                 "whose first layers nearly decide its output, for speculative decoding by early exit or a truncated "
                 "draft at chosen acceptance rates")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--damp", damp, "the scale of --damp-layers")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  app.add_option("--keep-layers", keep_layers, "with --from: write only the first N layers (a draft model cut from its target)")
      ->check(CLI::Range(1, 1 << 16));
  std::string heads_from;
  app.add_option("--heads-from", heads_from,
                 "pack trained speculative heads (a safetensors file from troupe-train: medusa.* or eagle.* tensors) "
                 "as a head file for the --from model, which records its shape and vocabulary");
  CLI11_PARSE(app, argc, argv);

  if (!heads_from.empty()) {
    if (from.empty()) {
      std::fprintf(stderr, "make-model: --heads-from needs --from, the model the heads were trained for\n");
      return 2;
    }
    auto target = tools::load_model_and_tokenizer(from, from_tokenizer);
    if (!target) {
      std::fprintf(stderr, "make-model: %s\n", target.err().message.c_str());
      return 1;
    }
    auto file = mapped_file::open(heads_from);
    auto heads = file ? safetensors_file::parse(std::move(*file)) : expected<safetensors_file>(file.err());
    if (!heads) {
      std::fprintf(stderr, "make-model: %s\n", heads.err().message.c_str());
      return 1;
    }
    if (auto st = write_heads(out, *heads, target->m, target->tok->vocab()); !st) {
      std::fprintf(stderr, "make-model: %s\n", st.err().message.c_str());
      return 1;
    }
    std::fprintf(stderr, "make-model: wrote %s, heads for %s\n", out.c_str(), from.c_str());
    return 0;
  }

  // A preset fills the shape; a flag given beside it wins (--preset 110m --context 4096).
  for (const auto& p : presets)
    if (preset_name == p.name) {
      auto take = [&](const char* flag, int32_t& field, int32_t value) {
        if (app.count(flag) == 0) field = value;
      };
      take("--dim", c.dim, p.dim);
      take("--hidden", c.hidden_dim, p.hidden);
      take("--layers", c.num_layers, p.layers);
      take("--heads", c.num_heads, p.heads);
      take("--kv-heads", c.num_kv_heads, p.kv_heads);
      take("--vocab", c.vocab_size, p.vocab);
      take("--context", c.max_seq_len, p.context);
    }
  if (c.num_kv_heads == 0) c.num_kv_heads = family == "llama3" && c.num_heads % 4 == 0 ? c.num_heads / 4 : c.num_heads;
  if (format.empty()) format = out.size() > 5 && out.substr(out.size() - 5) == ".gguf" ? "gguf" : "llama2c";
  if (family != "llama2") {
    // The families as their Hugging Face checkpoints define them: Q and K rotate in halves.
    c.rope = rope_layout::halves;
    c.rms_eps = 1e-6f;
    c.family = family == "qwen2" ? model_family::qwen2 : family == "mistral" ? model_family::mistral : model_family::llama;
    c.rope_base = family == "llama3" ? 500000.0f : family == "qwen2" ? 1000000.0f : 10000.0f;
    c.qkv_bias = family == "qwen2";
    if (family == "mistral") c.sliding_window = window >= 0 ? window : std::max(1, c.max_seq_len / 4);
    if (scaling.empty()) scaling = family == "llama3" ? "llama3" : "none";
  } else if (window >= 0) {
    std::fprintf(stderr, "make-model: --sliding-window belongs to --family mistral\n");
    return 2;
  }
  if (rope_theta > 0) c.rope_base = rope_theta;
  if (!scaling.empty() && scaling != "none") {
    rope_scaling& r = c.rope_scale;
    r.type = scaling == "linear" ? rope_scaling_type::linear : scaling == "llama3" ? rope_scaling_type::llama3 : rope_scaling_type::yarn;
    r.factor = rope_factor > 0 ? rope_factor : 8.0f;
    if (r.type != rope_scaling_type::linear) r.original_context = original_context > 0 ? original_context : std::max(1, c.max_seq_len / 4);
  }
  const dtype type = dtype_named(type_name).value();  // (--type takes only these names)

  std::optional<tools::loaded_model> source;
  vocabulary vocab;
  if (!from.empty()) {
    auto l = tools::load_model_and_tokenizer(from, from_tokenizer);
    if (!l && format == "llama2c") {
      // llama2.c files need no vocabulary; load the weights alone.
      auto m = load_model(from);
      if (!m) {
        std::fprintf(stderr, "make-model: %s\n", m.err().message.c_str());
        return 1;
      }
      source.emplace(tools::loaded_model{std::move(m).value(), std::nullopt});
    } else if (!l) {
      std::fprintf(stderr, "make-model: %s\n", l.err().message.c_str());
      return 1;
    } else {
      source.emplace(std::move(l).value());
    }
    c = source->m.config;
    if (keep_layers != 0) {
      if (keep_layers > c.num_layers) {
        std::fprintf(stderr, "make-model: --keep-layers %d: the model has %d layers\n", keep_layers, c.num_layers);
        return 1;
      }
      c.num_layers = keep_layers;
    }
    if (pad_ffn != 0) {
      if (pad_ffn < c.hidden_dim) {
        std::fprintf(stderr, "make-model: --pad-ffn %d: the model's FFN is already %d wide; name a wider one\n", pad_ffn,
                     c.hidden_dim);
        return 1;
      }
      c.hidden_dim = pad_ffn;
    }
    separate = source->m.weights.classifier.data != source->m.weights.token_embedding.data ||
               source->m.weights.classifier.q != source->m.weights.token_embedding.q;
    if (source->tok) vocab = source->tok->vocab();
  } else if (pad_ffn != 0 || keep_layers != 0) {
    std::fprintf(stderr, "make-model: --pad-ffn and --keep-layers apply to a model given with --from\n");
    return 1;
  } else if (auto e = validate(c)) {
    std::fprintf(stderr, "make-model: %s\n", e->c_str());
    return 1;
  }
  if (format != "llama2c" && vocab.pieces.empty()) {
    if (!vocab_from.empty()) {
      const bool json = vocab_from.ends_with(".json");
      if (json && !source) {
        // A tokenizer.json sets the vocabulary's size; the model's embedding follows it.
        auto probe = load_tokenizer_json(vocab_from);
        if (probe) c.vocab_size = probe->size();
      }
      auto v = json ? load_tokenizer_json(vocab_from, c.vocab_size) : load_llama2c_vocabulary(vocab_from, c.vocab_size);
      if (!v) {
        std::fprintf(stderr, "make-model: %s\n", v.err().message.c_str());
        return 1;
      }
      vocab = std::move(v).value();
    } else {
      // <unk>, <s>, </s> and the 256 byte tokens come first.
      if (c.vocab_size < 259) {
        std::fprintf(stderr, "make-model: --vocab %d: a synthetic vocabulary needs at least 259 tokens (<unk>, <s>, </s> and "
                     "the 256 byte tokens); name a tokenizer with --vocab-from for a smaller one\n", c.vocab_size);
        return 1;
      }
      vocab = synthetic_vocabulary(c.vocab_size);
    }
  }

  checkpoint_spec spec{c, type, group_size, !separate};
  weight_source src = source ? weights_of(source->m) : random_weights(seed, family != "llama2");
  if (source && c.hidden_dim != source->m.config.hidden_dim) src = with_ffn_padded(std::move(src), source->m.config.hidden_dim);
  if (damp_from >= 0) {
    if (damp_from >= c.num_layers) {
      std::fprintf(stderr, "make-model: --damp-layers %d: the model has %d layers\n", damp_from, c.num_layers);
      return 1;
    }
    src = [inner = std::move(src), damp_from, damp](tensor_role role, int32_t layer, int32_t row, float* out, int32_t cols) {
      inner(role, layer, row, out, cols);
      if ((role == tensor_role::wo || role == tensor_role::w2) && layer >= damp_from)
        for (int32_t i = 0; i < cols; ++i) out[i] *= damp;
    };
  }
  const bool tty = isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](double f) {
    if (tty) std::fprintf(stderr, "\rmake-model: writing %s  %3.0f%%", out.c_str(), 100.0 * f);
  };
  std::fprintf(stderr, "make-model: %s, %s, %s%s\n", out.c_str(), format.c_str(), type_name.c_str(),
               source ? (", from " + from).c_str() : (", seed " + std::to_string(seed)).c_str());
  std::fprintf(stderr, "make-model: %s\n", describe(c).c_str());
  status st = format == "gguf"  ? write_gguf(out, spec, vocab, src, progress)
              : format == "hf" ? write_hf_dir(out, spec, src, progress)
                               : write_llama2c(out, spec, src, progress);
  // A Hugging Face directory carries its vocabulary: a tokenizer.json given with
  // --vocab-from (and the tokenizer_config.json beside it), else as a llama2.c
  // tokenizer.bin, which the tools find there too.
  if (st && format == "hf") {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::string json_file = vocab_from.ends_with(".json") ? vocab_from : "";
    if (json_file.empty() && source && fs::exists(fs::path(from) / "tokenizer.json")) json_file = from + "/tokenizer.json";
    if (!json_file.empty()) {
      fs::copy_file(json_file, fs::path(out) / "tokenizer.json", fs::copy_options::overwrite_existing, ec);
      const fs::path cfg = fs::path(json_file).parent_path() / "tokenizer_config.json";
      if (!ec && fs::exists(cfg)) fs::copy_file(cfg, fs::path(out) / "tokenizer_config.json", fs::copy_options::overwrite_existing, ec);
      if (ec) st = error{out + ": cannot copy the tokenizer: " + ec.message()};
    } else {
      st = write_llama2c_vocabulary(out + "/tokenizer.bin", vocab);
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  if (!st) {
    std::fprintf(stderr, "make-model: %s\n", st.err().message.c_str());
    if (format != "hf") std::remove(out.c_str());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "make-model: wrote %s in %.1f s\n", out.c_str(), secs);
  return 0;
}
