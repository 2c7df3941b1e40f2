// Hugging Face model directories: config.json read into a model_config (every field, the
// families' features, and an error naming the field for each mistake), safetensors files
// checked byte by byte, and round trips through the writer.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <doctest/doctest.h>

#include "engine/model/checkpoint_writer.hpp"
#include "engine/model/hf_config.hpp"
#include "engine/model/model.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

std::string config_text(const std::string& extra, const std::string& type = "llama") {
  return R"({"model_type": ")" + type + R"(", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 128)" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

// The error parse_hf_config gives, or "" when it accepts the text.
std::string config_error(const std::string& text) {
  auto c = parse_hf_config(text, "cfg.json");
  return c ? "" : c.err().message;
}

model_config tiny(model_family f) {
  model_config c;
  c.dim = 64;
  c.hidden_dim = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.vocab_size = 300;
  c.max_seq_len = 64;
  c.family = f;
  c.rope = rope_layout::halves;
  c.qkv_bias = f == model_family::qwen2;
  if (f == model_family::mistral) c.sliding_window = 8;
  return c;
}

}  // namespace

TEST_CASE("config.json: each family's fields and defaults") {
  auto llama = parse_hf_config(config_text(R"("rope_theta": 500000.0, "rms_norm_eps": 1e-5,
      "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 32})"), "cfg.json");
  REQUIRE_MESSAGE(llama.has_value(), (llama ? "" : llama.err().message));
  const model_config& c = llama->config;
  CHECK(c.family == model_family::llama);
  CHECK(c.num_kv_heads == 2);
  CHECK(c.head_dim == 16);
  CHECK(c.rope == rope_layout::halves);
  CHECK(c.rope_base == 500000.0f);
  CHECK(c.rms_eps == 1e-5f);
  CHECK(c.rope_scale.type == rope_scaling_type::llama3);
  CHECK(c.rope_scale.factor == 32.0f);
  CHECK(c.rope_scale.original_context == 32);
  CHECK_FALSE(c.qkv_bias);
  CHECK_FALSE(llama->tied_embeddings);

  auto qwen = parse_hf_config(config_text(R"("tie_word_embeddings": true, "use_sliding_window": false)", "qwen2"), "q");
  REQUIRE(qwen.has_value());
  CHECK(qwen->config.qkv_bias);
  CHECK(qwen->tied_embeddings);
  CHECK(qwen->config.rms_eps == 1e-6f);  // the families' default

  auto mistral = parse_hf_config(config_text(R"("sliding_window": 16)", "mistral"), "m");
  REQUIRE(mistral.has_value());
  CHECK(mistral->config.sliding_window == 16);
  auto unbounded = parse_hf_config(config_text(R"("sliding_window": null)", "mistral"), "m");
  REQUIRE(unbounded.has_value());
  CHECK(unbounded->config.sliding_window == 0);

  // architectures[0] when model_type is absent; head_dim when it is not dim / heads.
  auto by_arch = parse_hf_config(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 300, "head_dim": 32})", "a");
  REQUIRE_MESSAGE(by_arch.has_value(), (by_arch ? "" : by_arch.err().message));
  CHECK(by_arch->config.family == model_family::qwen2);
  CHECK(by_arch->config.q_dim() == 128);
}

TEST_CASE("config.json: every mistake is an error naming the field") {
  CHECK(config_error("not json").find("cfg.json: not a JSON object") == 0);
  CHECK(config_error(R"({"hidden_size": 64})").find("neither model_type nor architectures") != std::string::npos);
  CHECK(config_error(config_text("", "gpt2")).find("model_type 'gpt2' is not supported") != std::string::npos);
  CHECK(config_error(R"({"model_type": "llama", "hidden_size": 64})").find("intermediate_size is missing") != std::string::npos);
  CHECK(config_error(config_text(R"("num_key_value_heads": -2)")).find("num_key_value_heads = -2 must be a positive integer") !=
        std::string::npos);
  CHECK(config_error(config_text(R"("rms_norm_eps": "small")")).find("rms_norm_eps") != std::string::npos);
  CHECK(config_error(config_text(R"("tie_word_embeddings": 1)")).find("tie_word_embeddings") != std::string::npos);
  CHECK(config_error(config_text(R"("rope_scaling": {"rope_type": "dynamic", "factor": 2.0})"))
            .find("rope_scaling type 'dynamic' is not supported") != std::string::npos);
  CHECK(config_error(config_text(R"("rope_scaling": {"rope_type": "linear"})")).find("factor is missing") != std::string::npos);
  CHECK(config_error(config_text(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})"))
            .find("original_max_position_embeddings is missing") != std::string::npos);
  CHECK(config_error(config_text(R"("rope_scaling": {"rope_type": "linear", "factor": 0.5})")).find("factor") != std::string::npos);
  CHECK(config_error(config_text(R"("attention_bias": true)")).find("attention_bias") != std::string::npos);
  CHECK(config_error(config_text(R"("use_sliding_window": true)", "qwen2")).find("use_sliding_window") != std::string::npos);
  CHECK(config_error(config_text(R"("num_key_value_heads": 3)")).find("num_kv_heads") != std::string::npos);
}

TEST_CASE("Hugging Face directories: written and read back for every family, in f32, f16 and bf16") {
  test::temp_dir dir;
  for (model_family f : {model_family::llama, model_family::mistral, model_family::qwen2}) {
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
      CAPTURE(family_name(f));
      CAPTURE(dtype_name(t));
      checkpoint_spec spec{tiny(f), t, 64, f == model_family::qwen2};
      const std::string out = dir.file(std::string(family_name(f)) + "-" + std::string(dtype_name(t)));
      REQUIRE(write_hf_dir(out, spec, random_weights(3, true)).has_value());
      auto m = load_model(out);
      REQUIRE_MESSAGE(m.has_value(), (m ? "" : m.err().message));
      CHECK(m->weight_type == t);
      CHECK(m->config.family == f);
      CHECK(m->config.qkv_bias == (f == model_family::qwen2));
      CHECK(m->config.sliding_window == spec.config.sliding_window);
      CHECK((m->weights.classifier.data == m->weights.token_embedding.data) == spec.shared_classifier);
      CHECK(m->format.find("Hugging Face") == 0);
      // Norms and biases as written (the writer's random norms are not all 1).
      std::vector<float> want(spec.config.dim);
      random_weights(3, true)(tensor_role::ffn_norm, 1, 0, want.data(), spec.config.dim);
      CHECK(std::memcmp(want.data(), m->weights.layers[1].ffn_norm, sizeof(float) * want.size()) == 0);
      if (spec.config.qkv_bias) {
        const int32_t kv_dim = m->config.kv_dim();
        REQUIRE(kv_dim == 32);
        std::vector<float> bv(kv_dim);
        random_weights(3, true)(tensor_role::bv, 0, 0, bv.data(), kv_dim);
        CHECK(std::memcmp(bv.data(), m->weights.layers[0].bv, sizeof(float) * bv.size()) == 0);
      }
    }
  }
}

TEST_CASE("Hugging Face directories in shards: model.safetensors.index.json finds every tensor in its file") {
  test::temp_dir dir;
  checkpoint_spec spec{tiny(model_family::llama), dtype::bf16, 64, false};
  REQUIRE(write_hf_dir(dir.file("one"), spec, random_weights(5, true)).has_value());
  REQUIRE(write_hf_dir(dir.file("shards"), spec, random_weights(5, true), {}, 20000).has_value());
  CHECK(std::filesystem::exists(dir.file("shards") + "/model.safetensors.index.json"));
  CHECK_FALSE(std::filesystem::exists(dir.file("shards") + "/model.safetensors"));
  auto one = load_model(dir.file("one"));
  auto shards = load_model(dir.file("shards"));
  REQUIRE_MESSAGE(shards.has_value(), (shards ? "" : shards.err().message));
  REQUIRE(one.has_value());
  CHECK(shards->format.find("shards") != std::string::npos);
  CHECK(shards->weights.files.size() > 2);
  auto same = [](const matrix_view& a, const matrix_view& b) {
    return a.rows == b.rows && a.cols == b.cols && std::memcmp(a.data, b.data, size_t(a.rows) * a.cols * 2) == 0;
  };
  CHECK(same(one->weights.token_embedding, shards->weights.token_embedding));
  CHECK(same(one->weights.classifier, shards->weights.classifier));
  for (size_t l = 0; l < one->weights.layers.size(); ++l) {
    CHECK(same(one->weights.layers[l].wq, shards->weights.layers[l].wq));
    CHECK(same(one->weights.layers[l].w2, shards->weights.layers[l].w2));
  }
  // An index naming a shard that is not there.
  std::filesystem::remove(dir.file("shards") + "/model-00002-of-" +
                          std::filesystem::path(shards->weights.files.back().path()).filename().string().substr(15));
  auto missing = load_model(dir.file("shards"));
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().message.find("model-00002-of-") != std::string::npos);
}

TEST_CASE("Hugging Face directories: a missing file, tensor or shape is an error naming it") {
  test::temp_dir dir;
  checkpoint_spec spec{tiny(model_family::qwen2), dtype::f32, 64, true};
  const std::string good = dir.file("good");
  REQUIRE(write_hf_dir(good, spec, random_weights(3)).has_value());
  auto no_config = load_model(dir.path());
  REQUIRE_FALSE(no_config.has_value());
  CHECK(no_config.err().message.find("config.json") != std::string::npos);

  // A config whose shapes disagree with the tensors.
  std::filesystem::copy(good, dir.file("wide"), std::filesystem::copy_options::recursive);
  {
    std::ofstream cfg(dir.file("wide") + "/config.json");
    cfg << config_text(R"("intermediate_size": 192)", "qwen2");
  }
  auto wide = load_model(dir.file("wide"));
  REQUIRE_FALSE(wide.has_value());
  CHECK(wide.err().message.find("mlp.gate_proj.weight has shape [128, 64], the model needs [192, 64]") != std::string::npos);

  // No weights at all.
  std::filesystem::create_directories(dir.file("empty"));
  std::filesystem::copy_file(good + "/config.json", dir.file("empty") + "/config.json");
  auto empty = load_model(dir.file("empty"));
  REQUIRE_FALSE(empty.has_value());
  CHECK(empty.err().message.find("no model.safetensors") != std::string::npos);

  // An index naming a file outside the directory.
  std::filesystem::copy(good, dir.file("index"), std::filesystem::copy_options::recursive);
  {
    std::ofstream idx(dir.file("index") + "/model.safetensors.index.json");
    idx << R"({"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}})";
  }
  auto index = load_model(dir.file("index"));
  REQUIRE_FALSE(index.has_value());
  CHECK(index.err().message.find("is not a file in the directory") != std::string::npos);
}

TEST_CASE("safetensors: truncated and corrupted headers are errors naming the file") {
  test::temp_dir dir;
  checkpoint_spec spec{tiny(model_family::llama), dtype::f32, 64, false};
  const std::string good = dir.file("good");
  REQUIRE(write_hf_dir(good, spec, random_weights(3)).has_value());
  const std::vector<char> full = test::read_all(good + "/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, full.data(), 8);
  const std::string header(full.data() + 8, full.data() + 8 + n);
  const std::string file = dir.file("bad") + "/model.safetensors";
  std::filesystem::create_directories(dir.file("bad"));
  std::filesystem::copy_file(good + "/config.json", dir.file("bad") + "/config.json");
  auto expect = [&](const std::vector<char>& bytes, const std::string& what) {
    test::write_all(file, bytes);
    auto m = load_model(dir.file("bad"));
    REQUIRE_FALSE(m.has_value());
    CAPTURE(m.err().message);
    CHECK(m.err().message.find(file) != std::string::npos);
    CHECK(m.err().message.find(what) != std::string::npos);
  };
  // Cut anywhere: in the length, in the header, in the data.
  for (size_t cut : {size_t{3}, size_t{8} + n / 2, full.size() - 5}) {
    CAPTURE(cut);
    expect(std::vector<char>(full.begin(), full.begin() + cut), cut < 8 ? "too short" : cut < 8 + n ? "does not fit" : "outside the data");
  }
  auto with_header = [&](std::string h) {
    h.resize(n, ' ');
    std::vector<char> b = full;
    std::memcpy(b.data() + 8, h.data(), n);
    return b;
  };
  // The header with one change; the metadata makes room for a longer one.
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string h = header;
    const size_t meta = h.find(R"({"format":"pt"})");
    REQUIRE(meta != std::string::npos);
    h.replace(meta, 15, "{}");
    const size_t at = h.find(from);
    REQUIRE(at != std::string::npos);
    return with_header(h.replace(at, from.size(), to));
  };
  expect(with_header("[1, 2]"), "not a JSON object");
  expect(replaced("\"F32\"", "\"I64\""), "dtype I64 is not supported");
  expect(replaced("\"data_offsets\":[0,", "\"data_offsets\":[4,"), "bytes for");
  expect(replaced("\"shape\":[", "\"shape\":[-1,"), "not a size");
  // An element count that would wrap to 0 past 2^64, in a tensor no layer reads (a header
  // of its own length, padded to keep the data aligned).
  std::string wrapped = R"({"junk":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]},)" + header.substr(1);
  wrapped.resize((wrapped.size() + 7) / 8 * 8, ' ');
  std::vector<char> rebuilt(8);
  const uint64_t wrapped_size = wrapped.size();
  std::memcpy(rebuilt.data(), &wrapped_size, 8);
  rebuilt.insert(rebuilt.end(), wrapped.begin(), wrapped.end());
  rebuilt.insert(rebuilt.end(), full.begin() + 8 + static_cast<ptrdiff_t>(n), full.end());
  expect(rebuilt, "tensor junk: too many elements");
  std::vector<char> huge = full;
  const uint64_t big = uint64_t{1} << 62;
  std::memcpy(huge.data(), &big, 8);
  expect(huge, "does not fit");
}

TEST_CASE("rope frequencies: linear divides every pair, llama3 only the long wavelengths, yarn blends") {
  model_config c = tiny(model_family::llama);
  c.rope_dim = c.head_dim = 16;
  c.rope_base = 10000.0f;
  const std::vector<float> plain = rope_frequencies(c);
  c.rope_scale = {rope_scaling_type::linear, 4.0f};
  std::vector<float> f = rope_frequencies(c);
  for (size_t i = 0; i < f.size(); ++i) CHECK(f[i] == doctest::Approx(plain[i] / 4.0f));
  c.rope_scale = {rope_scaling_type::llama3, 8.0f, 1.0f, 4.0f, 64};
  f = rope_frequencies(c);
  CHECK(f.front() == plain.front());                             // wavelength 2 pi, under 64 / 4
  CHECK(f.back() == doctest::Approx(plain.back() / 8.0f));        // wavelength far over 64
  c.rope_scale = {rope_scaling_type::yarn, 4.0f, 1.0f, 4.0f, 64, 32.0f, 1.0f, 0.0f};
  f = rope_frequencies(c);
  CHECK(f.front() == doctest::Approx(plain.front()));             // fast pairs extrapolate
  CHECK(f.back() == doctest::Approx(plain.back() / 4.0f));        // slow pairs interpolate
  CHECK(rope_attention_factor(c) == doctest::Approx(0.1f * std::log(4.0f) + 1.0f));
}

}  // namespace troupe
