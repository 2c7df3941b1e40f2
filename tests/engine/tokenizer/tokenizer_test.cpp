#include "engine/tokenizer/tokenizer.hpp"

#include <doctest/doctest.h>

#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

const tokenizer& tok512() { return test::tok512(); }

}  // namespace

TEST_CASE("prompts encode to the reference's prompt ids, from tokenizer.bin and from GGUF") {
  const tokenizer a = tok512();
  auto m = load_model(test::models_dir() + "/stories260K.gguf");
  REQUIRE(m.has_value());
  const tokenizer b(*m->vocab);
  for (const auto& c : test::read_reference(test::shared_path("reference/stories260K_greedy.jsonl"))) {
    CAPTURE(c.prompt);
    const auto ids = a.encode(c.prompt, false);
    REQUIRE(ids.size() <= c.ids_after_bos.size());
    CHECK(std::vector<int32_t>(c.ids_after_bos.begin(), c.ids_after_bos.begin() + ids.size()) == ids);
    CHECK(b.encode(c.prompt, false) == ids);
    CHECK(a.decode_all(ids) == c.prompt);
  }
}

TEST_CASE("BOS, the dummy prefix and the leading-space rule") {
  const tokenizer t = tok512();
  CHECK(t.encode("", true) == std::vector<int32_t>{1});
  CHECK(t.encode("", false).empty());
  const auto ids = t.encode("Hello world", true);
  REQUIRE(ids.size() >= 2);
  CHECK(ids[0] == 1);
  CHECK(t.vocab().pieces[ids[1]][0] == ' ');         // the dummy prefix merged in
  CHECK(std::string(t.decode(1, ids[1]))[0] != ' ');  // and dropped after BOS
  CHECK(t.decode_all({ids.begin() + 1, ids.end()}) == "Hello world");
}

TEST_CASE("characters outside the vocabulary fall back to byte tokens and round-trip") {
  const tokenizer t = tok512();
  const std::string text = "caf\xc3\xa9 \xe2\x82\xac 10 \xf0\x9f\x99\x82!";  // é, €, an emoji
  const auto ids = t.encode(text, false);
  int bytes = 0;
  for (int32_t id : ids) bytes += t.vocab().kinds[id] == token_kind::byte;
  CHECK(bytes >= 4);  // the emoji, at least, is not a piece of this small vocabulary
  CHECK(t.decode_all(ids) == text);
}

TEST_CASE("merges take the highest score first, the leftmost on ties") {
  vocabulary v;
  v.pieces = {"<unk>", "<s>", "</s>", "a", "b", "ab", "bb", "abb", " "};
  v.scores = {0, 0, 0, 0, 0, -1, -2, -3, 0};
  v.add_space_prefix = false;
  REQUIRE_FALSE(validate(v).has_value());
  const tokenizer t(v);
  // "abb": "ab" (score -1) beats "bb" (-2); then "ab"+"b" -> "abb".
  CHECK(t.encode("abb", false) == std::vector<int32_t>{7});
  // "bbb": two "bb" candidates tie; the leftmost merges first.
  CHECK(t.encode("bbb", false) == std::vector<int32_t>{6, 4});
  CHECK(t.encode("ba", false) == std::vector<int32_t>{4, 3});
}

TEST_CASE("long inputs encode in reasonable time and round-trip") {
  const tokenizer t = tok512();
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "The little dog ran to the park. ";
  const auto ids = t.encode(text, false);
  CHECK(ids.size() < text.size());
  CHECK(t.decode_all(ids) == text);
}

}  // namespace troupe
