// Truncated, corrupted and hostile copies of real model files: every one gives an error
// naming the file, never a crash or an out-of-bounds read (run under ASan to see).
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string_view>
#include <fstream>
#include <iterator>
#include <span>

#include <doctest/doctest.h>

#include "engine/model/model.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "engine/tokenizer/vocabulary.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

// Loads a modified copy and expects an error that names the file and mentions one of
// `what` (each not empty).
void expect_error(const test::temp_dir& dir, const std::vector<char>& bytes, std::initializer_list<std::string_view> what) {
  const std::string path = dir.file("bad.model");
  test::write_all(path, bytes);
  auto m = load_model(path);
  REQUIRE_FALSE(m.has_value());
  const std::string& message = m.err().message;
  CAPTURE(message);
  CHECK(message.find(path) != std::string::npos);
  REQUIRE(what.size() > 0);
  CHECK(std::any_of(what.begin(), what.end(), [&](std::string_view w) {
    REQUIRE_FALSE(w.empty());
    return message.find(w) != std::string::npos;
  }));
}

template <class T>
void put(std::vector<char>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

// Offset of the first tensor info in a GGUF file (just after the metadata).
size_t gguf_tensor_info_offset(const std::vector<char>& b);

}  // namespace

TEST_CASE("truncated copies of every model file are rejected") {
  test::temp_dir dir;
  for (const char* f : {"stories260K.bin", "stories260K_q8.bin", "stories260K.gguf"}) {
    CAPTURE(f);
    const auto full = test::read_all(test::models_dir() + "/" + f);
    REQUIRE(full.size() > 1000);
    for (size_t keep : {size_t{0}, size_t{3}, size_t{20}, size_t{100}, size_t{300}, full.size() / 2, full.size() - 1}) {
      CAPTURE(keep);
      expect_error(dir, std::vector<char>(full.begin(), full.begin() + keep), {"truncated", "exceeds the file size"});
    }
  }
}

TEST_CASE("llama2.c headers that disagree with the file are rejected") {
  test::temp_dir dir;
  const auto orig = test::read_all(test::models_dir() + "/stories260K.bin");
  auto b = orig;
  put<int32_t>(b, 0, 65);  // dim no longer divisible by the heads and the size is wrong
  expect_error(dir, b, {"num_heads = 8 must divide dim"});
  b = orig;
  put<int32_t>(b, 8, 1 << 20);  // absurd layer count
  expect_error(dir, b, {"num_layers"});
  b = orig;
  put<int32_t>(b, 16, 3);  // 3 KV heads for 8 heads
  expect_error(dir, b, {"num_kv_heads"});
  b = orig;
  put<int32_t>(b, 20, -512);  // claims a separate classifier the file lacks
  expect_error(dir, b, {"truncated"});
  b = orig;
  put<int32_t>(b, 20, INT32_MIN);
  expect_error(dir, b, {"vocab_size"});
  b = orig;
  b.push_back(0);  // trailing garbage: the shapes do not describe this file
  expect_error(dir, b, {"needs"});

  const auto q8 = test::read_all(test::models_dir() + "/stories260K_q8.bin");
  b = q8;
  put<int32_t>(b, 4, 3);  // version
  expect_error(dir, b, {"version 3"});
  b = q8;
  put<int32_t>(b, 37, 5);  // group size that does not divide dim
  expect_error(dir, b, {"group size"});
  b = q8;
  put<int32_t>(b, 37, 0);
  expect_error(dir, b, {"group size"});
  b = q8;
  b[36] = 7;  // shared-classifier flag
  expect_error(dir, b, {"shared_classifier"});
}

namespace {

size_t gguf_tensor_info_offset(const std::vector<char>& b) {
  size_t o = 24;
  uint64_t n_kv;
  std::memcpy(&n_kv, b.data() + 16, 8);
  auto u64 = [&](size_t at) { uint64_t v; std::memcpy(&v, b.data() + at, 8); return v; };
  auto u32 = [&](size_t at) { uint32_t v; std::memcpy(&v, b.data() + at, 4); return v; };
  auto skip_value = [&](auto& self, uint32_t type) -> void {
    static const int sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) { o += 8 + u64(o); return; }
    if (type == 9) {
      const uint32_t et = u32(o);
      const uint64_t n = u64(o + 4);
      o += 12;
      for (uint64_t i = 0; i < n; ++i) self(self, et);
      return;
    }
    o += sizes[type];
  };
  for (uint64_t i = 0; i < n_kv; ++i) {
    o += 8 + u64(o);  // key
    const uint32_t type = u32(o);
    o += 4;
    skip_value(skip_value, type);
  }
  return o;
}

}  // namespace

TEST_CASE("corrupted GGUF files are rejected with the problem named") {
  test::temp_dir dir;
  const auto orig = test::read_all(test::models_dir() + "/stories260K.gguf");
  auto b = orig;
  b[0] = 'X';
  expect_error(dir, b, {"is this a llama2.c checkpoint?"});  // not GGUF: read as llama2.c, whose header is impossible
  b = orig;
  put<uint32_t>(b, 4, 7);
  expect_error(dir, b, {"version 7"});
  b = orig;
  put<uint64_t>(b, 8, uint64_t{1} << 60);  // tensor count
  expect_error(dir, b, {"exceeds the file size"});
  b = orig;
  put<uint64_t>(b, 16, uint64_t{1} << 62);  // metadata count
  expect_error(dir, b, {"exceeds the file size"});
  b = orig;
  put<uint64_t>(b, 24, uint64_t{1} << 40);  // first key length
  expect_error(dir, b, {"absurd"});
  b = orig;
  put<uint32_t>(b, 24 + 8 + 21, 99);  // type of the first value (tokenizer.ggml.tokens)
  expect_error(dir, b, {"unknown type 99"});

  // The first tensor info: name (token_embd.weight), n_dims, dims, type, offset.
  const size_t ti = gguf_tensor_info_offset(orig);
  const size_t name_len = 17;
  const size_t dims_at = ti + 8 + name_len + 4;
  b = orig;
  put<uint32_t>(b, dims_at + 16, 12);  // tensor type Q4_K
  expect_error(dir, b, {"does not read"});
  b = orig;
  put<uint64_t>(b, dims_at, 63);  // token_embd shape no longer matches the metadata
  expect_error(dir, b, {"shape"});
  b = orig;
  put<uint64_t>(b, dims_at + 20, uint64_t{1} << 40);  // data offset past the end
  expect_error(dir, b, {"runs past the end"});
  b = orig;
  put<uint64_t>(b, dims_at, uint64_t{1} << 39);  // absurd dimension
  expect_error(dir, b, {"absurd shape"});
  b = orig;
  put<uint32_t>(b, ti + 8 + name_len, 9);  // 9 dimensions
  expect_error(dir, b, {"dimensions"});
}

TEST_CASE("a file's bytes held in memory load as the file does, errors naming the name given") {
  for (const char* f : {"stories260K.bin", "stories260K.gguf"}) {
    CAPTURE(f);
    const auto bytes = test::read_all(test::models_dir() + "/" + f);
    const auto span = std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    auto from_file = load_model(test::models_dir() + "/" + f);
    REQUIRE(from_file.has_value());
    const bool gguf = std::string_view(f).ends_with(".gguf");
    auto held = gguf ? load_gguf(mapped_file::copy_of(span, "held")) : load_llama2c(mapped_file::copy_of(span, "held"));
    REQUIRE(held.has_value());
    CHECK(held->path == "held");
    CHECK(held->format == from_file->format);
    CHECK(held->config.dim == from_file->config.dim);
    CHECK(held->weights.streamed_bytes() == from_file->weights.streamed_bytes());
    const matrix_view& a = held->weights.token_embedding;
    const matrix_view& b = from_file->weights.token_embedding;
    REQUIRE(a.type == dtype::f32);
    REQUIRE(b.type == dtype::f32);
    CHECK(std::memcmp(a.data, b.data, sizeof(float) * static_cast<size_t>(a.cols)) == 0);
    auto cut = gguf ? load_gguf(mapped_file::copy_of(span.first(span.size() / 2), "half"))
                    : load_llama2c(mapped_file::copy_of(span.first(span.size() / 2), "half"));
    REQUIRE_FALSE(cut.has_value());
    CHECK(cut.err().message.find("half") == 0);
  }
  const auto tok = test::read_all(test::models_dir() + "/tok512.bin");
  const auto tok_span = std::span(reinterpret_cast<const uint8_t*>(tok.data()), tok.size());
  auto v = parse_llama2c_vocabulary(mapped_file::copy_of(tok_span, "tok"), 512);
  REQUIRE(v.has_value());
  CHECK(v->pieces == test::tok512().vocab().pieces);
  CHECK_FALSE(parse_llama2c_vocabulary(mapped_file::copy_of(tok_span.first(100), "tok"), 512).has_value());
  CHECK(mapped_file::copy_of({}, "empty").size() == 0);
}

TEST_CASE("a missing file, or a directory that is no model, is an error, not a crash") {
  auto m = load_model("/nonexistent/model.bin");
  REQUIRE_FALSE(m.has_value());
  CHECK(m.err().message.find("/nonexistent/model.bin") != std::string::npos);
  auto d = load_model(test::models_dir());
  REQUIRE_FALSE(d.has_value());
  // A directory is read as a Hugging Face model directory, which this one is not.
  CHECK(d.err().message.find(test::models_dir() + ": a model directory needs config.json") != std::string::npos);
  auto v = load_llama2c_vocabulary(test::models_dir() + "/stories260K.bin", 512);
  CHECK_FALSE(v.has_value());
  auto short_vocab = load_llama2c_vocabulary(test::models_dir() + "/tok512.bin", 600);
  REQUIRE_FALSE(short_vocab.has_value());
  CHECK(short_vocab.err().message.find("truncated") != std::string::npos);
  auto long_vocab = load_llama2c_vocabulary(test::models_dir() + "/tok512.bin", 500);
  REQUIRE_FALSE(long_vocab.has_value());
  CHECK(long_vocab.err().message.find("does not belong") != std::string::npos);
}

}  // namespace troupe
