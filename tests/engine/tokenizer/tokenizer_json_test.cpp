// tokenizer.json read into a byte-level vocabulary: the byte table, merges by rank,
// special tokens, and an error naming what is wrong for each kind of bad file.
#include <fstream>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.hpp"
#include "engine/tokenizer/tokenizer_json.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

using json = nlohmann::json;

// A byte-level tokenizer.json: the 256 bytes (ids 0-255 in byte order), then the pieces
// the merges make, then <|endoftext|> as a special added token.
json tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_level_encode(std::string(1, static_cast<char>(b)))] = id++;
  json m = json::array();
  for (const auto& [a, b] : merges) {
    const std::string merged = byte_level_encode(a + b);
    if (!vocab.contains(merged)) vocab[merged] = id++;
    m.push_back(byte_level_encode(a) + " " + byte_level_encode(b));
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Split"}, {"pattern", {{"Regex", qwen2_pattern}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}})}}},
          {"added_tokens", json::array({{{"id", id}, {"content", "<|endoftext|>"}, {"special", true}}})}};
}

std::string write(const test::temp_dir& dir, const json& j, const std::string& name = "tokenizer.json") {
  std::ofstream(dir.file(name)) << j.dump();
  return dir.file(name);
}

std::string load_error(const test::temp_dir& dir, const json& j) {
  auto v = load_tokenizer_json(write(dir, j));
  return v ? "" : v.err().message;
}

}  // namespace

TEST_CASE("GPT-2's byte table: every byte there and back, printable bytes as themselves") {
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    const std::string stored = byte_level_encode(one);
    CHECK(byte_level_decode(stored) == one);
    if (b >= '!' && b <= '~') CHECK(stored == one);
  }
  CHECK(byte_level_encode(" ") == "\xc4\xa0");  // U+0120, 'Ġ'
  CHECK(byte_level_encode("\n") == "\xc4\x8a");  // U+010A, 'Ċ'
  CHECK_FALSE(byte_level_decode("\xe4\xbd\xa0").has_value());  // a character past the table
}

TEST_CASE("byte-level BPE: merges apply by rank, splits follow the pattern, specials stand for themselves") {
  test::temp_dir dir;
  const json j = tiny_tokenizer({{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"1", "2"}});
  auto v = load_tokenizer_json(write(dir, j));
  REQUIRE_MESSAGE(v.has_value(), (v ? "" : v.err().message));
  CHECK(v->style == vocab_style::byte_level);
  CHECK(v->size() == 256 + 6 + 1);
  CHECK(v->eos_id == 262);  // <|endoftext|>, found by its name
  CHECK_FALSE(v->add_bos);
  const tokenizer tok(*v);
  // "hello": h+e (rank 1) and l+l (rank 0) first, then he+ll, then hell+o.
  CHECK(tok.encode("hello", false) == std::vector<int32_t>{259});
  // " world": the pattern keeps the space with the word; " w" merges.
  CHECK(tok.encode(" wor", false) == std::vector<int32_t>{260, 'o', 'r'});
  // Qwen2's pattern splits digits one by one, so "12" never merges.
  CHECK(tok.encode("12", false) == std::vector<int32_t>{'1', '2'});
  CHECK(tok.encode("hello<|endoftext|>hello", false) == std::vector<int32_t>{259, 262, 259});
  CHECK(tok.decode_all({259, 260, 'o', 'r', 262}) == "hello wor");
  // Long runs: 200,000 spaces split as the pattern says (one run, bytes here), 100,000
  // letters likewise.
  CHECK(tok.encode(std::string(200000, ' '), false) == std::vector<int32_t>(200000, ' '));
  CHECK(tok.encode(std::string(100000, 'x'), false) == std::vector<int32_t>(100000, 'x'));
  // Bytes that are not UTF-8 still encode, byte by byte.
  CHECK(tok.encode("\xff\xfe", false) == std::vector<int32_t>{0xff, 0xfe});
}

TEST_CASE("a match too deep for the pattern JIT's stack is found by the interpreter, not given up") {
  // (a)* over 100,000 letters recurses past the JIT's default stack; the splits after
  // it must still be found: "b" and "b" apart, never merged into "bb".
  test::temp_dir dir;
  json j = tiny_tokenizer({{"b", "b"}});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a)*|b";
  auto v = load_tokenizer_json(write(dir, j));
  REQUIRE_MESSAGE(v.has_value(), (v ? "" : v.err().message));
  const tokenizer tok(*v);
  const std::vector<int32_t> ids = tok.encode(std::string(100000, 'a') + "bb", false);
  REQUIRE(ids.size() == 100002);
  CHECK(ids[100000] == 'b');
  CHECK(ids[100001] == 'b');
}

TEST_CASE("tokenizer.json: every unsupported or broken part is an error naming it") {
  test::temp_dir dir;
  const json good = tiny_tokenizer({{"h", "e"}});
  CHECK(load_error(dir, good).empty());

  json word_piece = good;
  word_piece["model"]["type"] = "WordPiece";
  CHECK(load_error(dir, word_piece).find("model type WordPiece is not supported") != std::string::npos);

  json nfkc = good;
  nfkc["normalizer"] = {{"type", "NFKC"}};
  CHECK(load_error(dir, nfkc).find("normalizer NFKC is not supported") != std::string::npos);

  json unknown_merge = good;
  unknown_merge["model"]["merges"].push_back("zz q");
  CHECK(load_error(dir, unknown_merge).find("names a piece the vocabulary lacks") != std::string::npos);

  json bad_pattern = good;
  bad_pattern["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  CHECK(load_error(dir, bad_pattern).find("does not compile") != std::string::npos);

  json no_eos = good;
  no_eos["added_tokens"] = json::array();
  CHECK(load_error(dir, no_eos).find("no end-of-text token") != std::string::npos);

  json missing_byte = good;
  missing_byte["model"]["vocab"].erase(byte_level_encode("\x07"));
  CHECK(load_error(dir, missing_byte).find("no token for byte 7") != std::string::npos);

  CHECK(load_error(dir, json::array()).find("not a JSON object") != std::string::npos);
  auto missing = load_tokenizer_json(dir.file("absent.json"));
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().message.find("absent.json") != std::string::npos);
}

TEST_CASE("tokenizer_config.json beside tokenizer.json names BOS and EOS and whether text starts with BOS") {
  test::temp_dir dir;
  json j = tiny_tokenizer({{"h", "e"}});
  j["added_tokens"].push_back({{"id", 258}, {"content", "<|start|>"}, {"special", true}});
  write(dir, j);
  write(dir, {{"bos_token", "<|start|>"}, {"eos_token", {{"content", "<|endoftext|>"}}}, {"add_bos_token", true}},
        "tokenizer_config.json");
  auto v = load_tokenizer_json(dir.file("tokenizer.json"));
  REQUIRE_MESSAGE(v.has_value(), (v ? "" : v.err().message));
  CHECK(v->bos_id == 258);
  CHECK(v->eos_id == 257);
  CHECK(v->add_bos);
  const tokenizer tok(*v);
  CHECK(tok.encode("he", true) == std::vector<int32_t>{258, 256});

  // The same two files as text (the fuzz target's way in) read the same; without the
  // config, the usual names decide and BOS is not added.
  auto from_text = parse_tokenizer_json(j.dump(), R"({"bos_token": "<|start|>", "eos_token": "<|endoftext|>", "add_bos_token": true})",
                                        "mem/tokenizer.json");
  REQUIRE(from_text.has_value());
  CHECK(from_text->pieces == v->pieces);
  CHECK(from_text->bos_id == 258);
  CHECK(from_text->add_bos);
  auto alone = parse_tokenizer_json(j.dump(), "", "mem/tokenizer.json");
  REQUIRE(alone.has_value());
  CHECK_FALSE(alone->add_bos);
  auto bad_config = parse_tokenizer_json(j.dump(), "[1]", "mem/tokenizer.json");
  REQUIRE_FALSE(bad_config.has_value());
  CHECK(bad_config.err().message == "mem/tokenizer_config.json: not a JSON object");
}

}  // namespace troupe
