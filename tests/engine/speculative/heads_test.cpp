// Head files (engine/speculative/heads.hpp): written for a target and read back; refused, with a
// reason, for another model's shape or vocabulary, when they are not head files, or when a
// tensor has the wrong shape.
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/speculative/heads.hpp"
#include "engine/speculative/speculative.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

// A safetensors file in memory: F32 tensors of the given shapes, element i of each i / 1000.
safetensors_file safetensors_of(const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::string header = "{";
  std::vector<uint8_t> data;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::string dims;
    for (int64_t d : shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    header += (header.size() > 1 ? "," : "") + std::string("\"") + name + "\":{\"dtype\":\"F32\",\"shape\":[" + dims +
              "],\"data_offsets\":[" + std::to_string(data.size()) + "," + std::to_string(data.size() + 4 * n) + "]}";
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(i) / 1000.0f;
      uint8_t b[4];
      std::memcpy(b, &v, 4);
      data.insert(data.end(), b, b + 4);
    }
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts aligned
  std::vector<uint8_t> bytes(8);
  const uint64_t len = header.size();
  std::memcpy(bytes.data(), &len, 8);
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  auto f = safetensors_file::parse(mapped_file::copy_of(bytes, "heads.safetensors"));
  CAPTURE((f ? std::string() : f.err().message));
  REQUIRE(f.has_value());
  return std::move(f).value();
}

std::map<std::string, std::vector<int64_t>> medusa_shapes(int32_t heads, int64_t dim) {
  std::map<std::string, std::vector<int64_t>> s;
  for (int32_t i = 0; i < heads; ++i) {
    s["medusa." + std::to_string(i) + ".0.weight"] = {dim, dim};
    s["medusa." + std::to_string(i) + ".0.bias"] = {dim};
  }
  return s;
}

std::string temp_file(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }

std::string refusal(const std::string& path, const model& m, const vocabulary* v) {
  auto h = load_heads(path, m, v);
  REQUIRE(!h.has_value());
  return h.err().message;
}

}  // namespace

TEST_CASE("a vocabulary's fingerprint follows every piece, and where one ends") {
  vocabulary a;
  a.pieces = {"<s>", "ab", "c"};
  vocabulary b = a;
  CHECK(vocabulary_fingerprint(a) == vocabulary_fingerprint(b));
  b.pieces[2] = "d";
  CHECK(vocabulary_fingerprint(a) != vocabulary_fingerprint(b));
  b.pieces = {"<s>", "a", "bc"};  // the same bytes, split elsewhere
  CHECK(vocabulary_fingerprint(a) != vocabulary_fingerprint(b));
  CHECK(vocabulary_fingerprint(a).size() == 16);
}

TEST_CASE("Medusa heads written for a target read back for it, and for no other model") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const vocabulary& v = l.tok.vocab();
  const std::string path = temp_file("troupe_heads_medusa.gguf");
  REQUIRE(write_heads(path, safetensors_of(medusa_shapes(3, 64)), l.m, v).has_value());

  auto h = load_heads(path, l.m, &v);
  REQUIRE(h.has_value());
  const speculative_heads& heads = **h;
  CHECK(heads.kind == heads_kind::medusa);
  CHECK(heads.depth() == 3);
  REQUIRE(heads.medusa.size() == 3);
  CHECK(heads.medusa[2].blocks.size() == 1);
  const matrix_view& w = heads.medusa[1].blocks[0].w;
  CHECK(w.rows == 64);
  CHECK(w.cols == 64);
  CHECK(static_cast<const float*>(w.data)[65] == doctest::Approx(0.065f));  // row 1, column 1
  CHECK(heads.medusa[0].blocks[0].bias[7] == doctest::Approx(0.007f));
  CHECK(heads.describe() == "3 Medusa heads (1 residual block and the model's classifier each)");

  // Heads with classifiers of their own.
  auto own = medusa_shapes(2, 64);
  own["medusa.0.output.weight"] = {512, 64};
  own["medusa.1.output.weight"] = {512, 64};
  const std::string own_path = temp_file("troupe_heads_medusa_own.gguf");
  REQUIRE(write_heads(own_path, safetensors_of(own), l.m, v).has_value());
  auto o = load_heads(own_path, l.m, &v);
  REQUIRE(o.has_value());
  REQUIRE((*o)->medusa[1].classifier.has_value());
  CHECK((*o)->medusa[1].classifier->rows == 512);
  CHECK((*o)->describe() == "2 Medusa heads (1 residual block and a classifier each)");
  std::filesystem::remove(own_path);

  // The method and k must fit them.
  speculative_config c;
  c.method = spec_method::eagle;
  CHECK(check_heads(c, heads).value_or("").find("holds Medusa heads") != std::string::npos);
  c.method = spec_method::medusa;
  c.k = 3;
  CHECK(!check_heads(c, heads).has_value());
  c.k = 4;
  CHECK(check_heads(c, heads).value_or("").find("deeper than the 3 Medusa heads") != std::string::npos);

  // Another model's shape.
  model other = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin").m;
  other.config.num_layers = 4;
  CHECK(refusal(path, other, &v).find("heads trained for another model: theirs has dim 64, 5 layers") != std::string::npos);
  // The same shape, another vocabulary.
  vocabulary renamed = v;
  renamed.pieces[300] += "x";
  CHECK(refusal(path, l.m, &renamed).find("another vocabulary") != std::string::npos);
  // Without a vocabulary at hand, the shape alone is checked.
  CHECK(load_heads(path, l.m, nullptr).has_value());
  std::filesystem::remove(path);
}

TEST_CASE("files that are not head files, and heads of the wrong shape, are refused with a reason") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const vocabulary& v = l.tok.vocab();
  // A model is not a head file.
  CHECK(refusal(test::models_dir() + "/stories260K.gguf", l.m, &v).find("is not a head file: its architecture is 'llama'") !=
        std::string::npos);
  // Nor is a file that is not GGUF.
  CHECK(refusal(test::models_dir() + "/tok512.bin", l.m, &v).find("a head file is a GGUF file") != std::string::npos);
  CHECK(refusal("/nonexistent/heads.gguf", l.m, &v).find("cannot open") != std::string::npos);

  // A block of the wrong width is found when the file is written, and nothing is left.
  const std::string path = temp_file("troupe_heads_bad.gguf");
  auto shapes = medusa_shapes(2, 64);
  shapes["medusa.1.0.weight"] = {64, 32};
  const status st = write_heads(path, safetensors_of(shapes), l.m, v);
  REQUIRE(!st.has_value());
  CHECK(st.err().message.find("tensor medusa.1.0.weight is [64 x 32]; this model needs [64 x 64]") != std::string::npos);
  CHECK(!std::filesystem::exists(path));
  // An EAGLE layer missing a tensor.
  std::map<std::string, std::vector<int64_t>> eagle = {{"eagle.fc.weight", {64, 128}}, {"eagle.fc.bias", {64}}};
  const status e = write_heads(path, safetensors_of(eagle), l.m, v);
  REQUIRE(!e.has_value());
  CHECK(e.err().message.find("eagle.ffn_gate.weight is missing") != std::string::npos);
  // A tensor no head reads.
  shapes = medusa_shapes(1, 64);
  shapes["medusa.0.0.scale"] = {64};
  const status x = write_heads(path, safetensors_of(shapes), l.m, v);
  REQUIRE(!x.has_value());
  CHECK(x.err().message.find("tensor medusa.0.0.scale belongs to no head") != std::string::npos);
  // Tensors of neither kind.
  const status n = write_heads(path, safetensors_of({{"medusa.0.0.weight", {64, 64}}, {"other", {4}}}), l.m, v);
  REQUIRE(!n.has_value());
  CHECK(n.err().message.find("neither Medusa's") != std::string::npos);
}

}  // namespace troupe
