// make-model's work: a checkpoint's shape settled, its weights generated from a seed or
// read from a model, and written in llama2.c, GGUF or Hugging Face form.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "engine/model/checkpoint_writer.hpp"
#include "engine/speculative/heads.hpp"
#include "engine/tokenizer/tokenizer_json.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/make-model/make_options.hpp"

namespace troupe::tools {
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

// The shape from the preset, the family's settings and the rope flags; false (with the
// reason on stderr) for flags that do not go together.
bool settle_shape(make_options& o, const CLI::App& app) {
  // A model converted keeps its architecture: flags that would describe another are refused.
  if (!o.from.empty())
    for (const char* flag : {"--family", "--sliding-window", "--rope-theta"})
      if (app.count(flag) > 0) {
        std::fprintf(stderr, "make-model: %s describes a generated model; --from converts %s as it is\n", flag,
                     o.from.c_str());
        return false;
      }
  // A preset fills the shape; a flag given beside it wins (--preset 110m --context 4096).
  for (const auto& p : presets)
    if (o.preset_name == p.name) {
      auto take = [&](const char* flag, int32_t& field, int32_t value) {
        if (app.count(flag) == 0) field = value;
      };
      take("--dim", o.c.dim, p.dim);
      take("--hidden", o.c.hidden_dim, p.hidden);
      take("--layers", o.c.num_layers, p.layers);
      take("--heads", o.c.num_heads, p.heads);
      take("--kv-heads", o.c.num_kv_heads, p.kv_heads);
      take("--vocab", o.c.vocab_size, p.vocab);
      take("--context", o.c.max_seq_len, p.context);
    }
  if (o.c.num_kv_heads == 0) o.c.num_kv_heads = o.family == "llama3" && o.c.num_heads % 4 == 0 ? o.c.num_heads / 4 : o.c.num_heads;
  if (o.format.empty()) o.format = o.out.size() > 5 && o.out.substr(o.out.size() - 5) == ".gguf" ? "gguf" : "llama2c";
  if (o.family != "llama2") {
    // The families as their Hugging Face checkpoints define them: Q and K rotate in halves.
    o.c.rope = rope_layout::halves;
    o.c.rms_eps = 1e-6f;
    o.c.family = o.family == "qwen2" ? model_family::qwen2 : o.family == "mistral" ? model_family::mistral : model_family::llama;
    o.c.rope_base = o.family == "llama3" ? 500000.0f : o.family == "qwen2" ? 1000000.0f : 10000.0f;
    o.c.qkv_bias = o.family == "qwen2";
    if (o.family == "mistral") o.c.sliding_window = o.window >= 0 ? o.window : std::max(1, o.c.max_seq_len / 4);
    if (o.scaling.empty()) o.scaling = o.family == "llama3" ? "llama3" : "none";
  } else if (o.window >= 0) {
    std::fprintf(stderr, "make-model: --sliding-window belongs to --family mistral\n");
    return false;
  }
  if (o.rope_theta > 0) o.c.rope_base = o.rope_theta;
  if (!o.scaling.empty() && o.scaling != "none") {
    rope_scaling& r = o.c.rope_scale;
    r.type = o.scaling == "linear" ? rope_scaling_type::linear : o.scaling == "llama3" ? rope_scaling_type::llama3 : rope_scaling_type::yarn;
    r.factor = o.rope_factor > 0 ? o.rope_factor : 8.0f;
    if (r.type != rope_scaling_type::linear) r.original_context = o.original_context > 0 ? o.original_context : std::max(1, o.c.max_seq_len / 4);
  }
  return true;
}

}  // namespace

void add_make_options(CLI::App& app, make_options& o) {
  app.add_option("output", o.out, "file to write (.bin: llama2c, .gguf: gguf, unless --format says; a directory for hf)")->required();
  app.add_option("--format", o.format, "llama2c, gguf or hf (a Hugging Face directory: config.json, model.safetensors)")
      ->check(CLI::IsMember({"llama2c", "gguf", "hf"}));
  app.add_option("--family", o.family,
                 "llama2; llama3 (GQA, rope base 500000, llama3 rope scaling); qwen2 (q/k/v biases, rope base 1e6); "
                 "mistral (sliding window)")
      ->check(CLI::IsMember({"llama2", "llama3", "qwen2", "mistral"}))->capture_default_str();
  app.add_option("--rope-theta", o.rope_theta, "rotary base (default: the family's)");
  app.add_option("--rope-scaling", o.scaling, "none, linear, llama3 or yarn (default: the family's)")
      ->check(CLI::IsMember({"none", "linear", "llama3", "yarn"}));
  app.add_option("--rope-factor", o.rope_factor, "rope scaling factor (default 8)");
  app.add_option("--original-context", o.original_context, "llama3 and yarn: the context before scaling (default: a quarter of --context)");
  app.add_option("--sliding-window", o.window, "mistral: the attention window in tokens (default: a quarter of --context)");
  app.add_option("--type", o.type_name, "weight type: f32, f16, bf16 or q8_0")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}))->capture_default_str();
  app.add_option("--preset", o.preset_name, "a named shape: 260k, 15m, 110m (dim 768, hidden 2048, 12 layers, 12 heads, vocab 32000), 1b")
      ->check(CLI::IsMember({"260k", "15m", "110m", "1b"}));
  app.add_option("--dim", o.c.dim, "residual width")->capture_default_str();
  app.add_option("--hidden", o.c.hidden_dim, "FFN width")->capture_default_str();
  app.add_option("--layers", o.c.num_layers, "transformer layers")->capture_default_str();
  app.add_option("--heads", o.c.num_heads, "query heads (dim must be a multiple of it)")->capture_default_str();
  app.add_option("--kv-heads", o.c.num_kv_heads, "default: --heads");
  app.add_option("--vocab", o.c.vocab_size, "vocabulary size")->capture_default_str();
  app.add_option("--context", o.c.max_seq_len, "context length in tokens")->capture_default_str();
  app.add_option("--seed", o.seed, "weights' random seed: the same seed, the same file")->capture_default_str();
  app.add_option("--group-size", o.group_size, "Q8_0 group size of llama2.c version 2 files")->capture_default_str();
  app.add_flag("--separate-classifier", o.separate, "write an output matrix instead of sharing the embedding");
  app.add_option("--vocab-from", o.vocab_from,
                 "the vocabulary: a llama2.c tokenizer.bin, or a Hugging Face tokenizer.json (which sets --vocab) "
                 "(default: a synthetic one)");
  app.add_option("--from", o.from, "convert this model instead of generating weights");
  app.add_option("-z,--tokenizer", o.from_tokenizer, "tokenizer.bin of the --from model, if it has none");
  app.add_option("--pad-ffn", o.pad_ffn,
                 "with --from: widen the FFN to this many columns with zero weights, which changes no output (a Q8_0 "
                 "group size that does not divide the model's FFN then fits: stories260K's 172 to 192 for groups of 32)");
  app.add_option("--damp-layers", o.damp_from,
                 "layers from this one on write to the residual stream scaled by --damp (their wo and w2): a model "
                 "whose first layers nearly decide its output, for speculative decoding by early exit or a truncated "
                 "draft at chosen acceptance rates")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--damp", o.damp, "the scale of --damp-layers")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  app.add_option("--keep-layers", o.keep_layers, "with --from: write only the first N layers (a draft model cut from its target)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--heads-from", o.heads_from,
                 "pack trained speculative heads (a safetensors file from troupe-train: medusa.* or eagle.* tensors) "
                 "as a head file for the --from model, which records its shape and vocabulary");
}

int pack_heads(const make_options& o) {
  if (o.from.empty()) {
    std::fprintf(stderr, "make-model: --heads-from needs --from, the model the heads were trained for\n");
    return 2;
  }
  auto target = load_model_and_tokenizer(o.from, o.from_tokenizer);
  if (!target) {
    std::fprintf(stderr, "make-model: %s\n", target.err().message.c_str());
    return 1;
  }
  auto file = mapped_file::open(o.heads_from);
  auto heads = file ? safetensors_file::parse(std::move(*file)) : expected<safetensors_file>(file.err());
  if (!heads) {
    std::fprintf(stderr, "make-model: %s\n", heads.err().message.c_str());
    return 1;
  }
  if (auto st = write_heads(o.out, *heads, target->m, target->tok->vocab()); !st) {
    std::fprintf(stderr, "make-model: %s\n", st.err().message.c_str());
    return 1;
  }
  std::fprintf(stderr, "make-model: wrote %s, heads for %s\n", o.out.c_str(), o.from.c_str());
  return 0;
}

int make_checkpoint(make_options& o, const CLI::App& app) {
  if (!settle_shape(o, app)) return 2;
  const dtype type = dtype_named(o.type_name).value();  // (--type takes only these names)

  std::optional<loaded_model> source;
  vocabulary vocab;
  if (!o.from.empty()) {
    auto l = load_model_and_tokenizer(o.from, o.from_tokenizer);
    if (!l && o.format == "llama2c") {
      // llama2.c files need no vocabulary; load the weights alone.
      auto m = load_model(o.from);
      if (!m) {
        std::fprintf(stderr, "make-model: %s\n", m.err().message.c_str());
        return 1;
      }
      source.emplace(loaded_model{std::move(m).value(), std::nullopt});
    } else if (!l) {
      std::fprintf(stderr, "make-model: %s\n", l.err().message.c_str());
      return 1;
    } else {
      source.emplace(std::move(l).value());
    }
    o.c = source->m.config;
    if (o.keep_layers != 0) {
      if (o.keep_layers > o.c.num_layers) {
        std::fprintf(stderr, "make-model: --keep-layers %d: the model has %d layers\n", o.keep_layers, o.c.num_layers);
        return 1;
      }
      o.c.num_layers = o.keep_layers;
    }
    if (o.pad_ffn != 0) {
      if (o.pad_ffn < o.c.hidden_dim) {
        std::fprintf(stderr, "make-model: --pad-ffn %d: the model's FFN is already %d wide; name a wider one\n", o.pad_ffn,
                     o.c.hidden_dim);
        return 1;
      }
      o.c.hidden_dim = o.pad_ffn;
    }
    o.separate = source->m.weights.classifier.data != source->m.weights.token_embedding.data ||
               source->m.weights.classifier.q != source->m.weights.token_embedding.q;
    if (source->tok) vocab = source->tok->vocab();
  } else if (o.pad_ffn != 0 || o.keep_layers != 0) {
    std::fprintf(stderr, "make-model: --pad-ffn and --keep-layers apply to a model given with --from\n");
    return 1;
  } else if (auto e = validate(o.c)) {
    std::fprintf(stderr, "make-model: %s\n", e->c_str());
    return 1;
  }
  if (o.format != "llama2c" && vocab.pieces.empty()) {
    if (!o.vocab_from.empty()) {
      const bool json = o.vocab_from.ends_with(".json");
      if (json && !source) {
        // A tokenizer.json sets the vocabulary's size; the model's embedding follows it.
        auto probe = load_tokenizer_json(o.vocab_from);
        if (probe) o.c.vocab_size = probe->size();
      }
      auto v = json ? load_tokenizer_json(o.vocab_from, o.c.vocab_size) : load_llama2c_vocabulary(o.vocab_from, o.c.vocab_size);
      if (!v) {
        std::fprintf(stderr, "make-model: %s\n", v.err().message.c_str());
        return 1;
      }
      vocab = std::move(v).value();
    } else {
      // <unk>, <s>, </s> and the 256 byte tokens come first.
      if (o.c.vocab_size < 259) {
        std::fprintf(stderr, "make-model: --vocab %d: a synthetic vocabulary needs at least 259 tokens (<unk>, <s>, </s> and "
                     "the 256 byte tokens); name a tokenizer with --vocab-from for a smaller one\n", o.c.vocab_size);
        return 1;
      }
      vocab = synthetic_vocabulary(o.c.vocab_size);
    }
  }

  checkpoint_spec spec{o.c, type, o.group_size, !o.separate};
  weight_source src = source ? weights_of(source->m) : random_weights(o.seed, o.family != "llama2");
  if (source && o.c.hidden_dim != source->m.config.hidden_dim) src = with_ffn_padded(std::move(src), source->m.config.hidden_dim);
  if (o.damp_from >= 0) {
    if (o.damp_from >= o.c.num_layers) {
      std::fprintf(stderr, "make-model: --damp-layers %d: the model has %d layers\n", o.damp_from, o.c.num_layers);
      return 1;
    }
    src = [inner = std::move(src), damp_from = o.damp_from, damp = o.damp](tensor_role role, int32_t layer, int32_t row,
                                                                           float* out, int32_t cols) {
      inner(role, layer, row, out, cols);
      if ((role == tensor_role::wo || role == tensor_role::w2) && layer >= damp_from)
        for (int32_t i = 0; i < cols; ++i) out[i] *= damp;
    };
  }
  const bool tty = isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](double f) {
    if (tty) std::fprintf(stderr, "\rmake-model: writing %s  %3.0f%%", o.out.c_str(), 100.0 * f);
  };
  std::fprintf(stderr, "make-model: %s, %s, %s%s\n", o.out.c_str(), o.format.c_str(), o.type_name.c_str(),
               source ? (", from " + o.from).c_str() : (", seed " + std::to_string(o.seed)).c_str());
  std::fprintf(stderr, "make-model: %s\n", describe(o.c).c_str());
  status st = o.format == "gguf"  ? write_gguf(o.out, spec, vocab, src, progress)
              : o.format == "hf" ? write_hf_dir(o.out, spec, src, progress)
                               : write_llama2c(o.out, spec, src, progress);
  // A Hugging Face directory carries its vocabulary: a tokenizer.json given with
  // --vocab-from (and the tokenizer_config.json beside it), else as a llama2.c
  // tokenizer.bin, which the tools find there too.
  if (st && o.format == "hf") {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::string json_file = o.vocab_from.ends_with(".json") ? o.vocab_from : "";
    if (json_file.empty() && source && fs::exists(fs::path(o.from) / "tokenizer.json")) json_file = o.from + "/tokenizer.json";
    if (!json_file.empty()) {
      fs::copy_file(json_file, fs::path(o.out) / "tokenizer.json", fs::copy_options::overwrite_existing, ec);
      const fs::path cfg = fs::path(json_file).parent_path() / "tokenizer_config.json";
      if (!ec && fs::exists(cfg)) fs::copy_file(cfg, fs::path(o.out) / "tokenizer_config.json", fs::copy_options::overwrite_existing, ec);
      if (ec) st = error{o.out + ": cannot copy the tokenizer: " + ec.message()};
    } else {
      st = write_llama2c_vocabulary(o.out + "/tokenizer.bin", vocab);
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  if (!st) {
    std::fprintf(stderr, "make-model: %s\n", st.err().message.c_str());
    if (o.format != "hf") std::remove(o.out.c_str());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "make-model: wrote %s in %.1f s\n", o.out.c_str(), secs);
  return 0;
}

}  // namespace troupe::tools
