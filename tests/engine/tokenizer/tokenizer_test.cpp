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

TEST_CASE("a byte token whose text names no byte is its text, and the real byte tokens still serve") {
  vocabulary v;
  v.pieces = {"<unk>", "<s>", "</s>", "<0x-4>", "<0x41>", "<0xzz>", "<0x4142>", "a"};
  v.scores.assign(v.pieces.size(), 0);
  v.kinds.assign(v.pieces.size(), token_kind::byte);
  v.kinds[0] = token_kind::unknown;
  v.kinds[1] = v.kinds[2] = token_kind::control;
  v.kinds[7] = token_kind::normal;
  v.add_space_prefix = false;
  const tokenizer t(v);  // "<0x-4>" once indexed a 256-entry table at 4294967292
  CHECK(t.decode_all({3, 5, 6}) == "<0x-4><0xzz><0x4142>");
  CHECK(t.decode_all({4}) == "A");
  CHECK(t.encode("A", false) == std::vector<int32_t>{4});  // the one true byte token
}

TEST_CASE("control and user-defined pieces in the text are their tokens, the text around them merged apart") {
  vocabulary v;
  v.pieces = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im", " ", "u", "s", "\n", " u", " us", "<", "|", "i", "m"};
  v.scores = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0};
  v.kinds.assign(v.pieces.size(), token_kind::normal);
  v.kinds[0] = token_kind::unknown;
  v.kinds[1] = v.kinds[2] = token_kind::control;
  v.kinds[3] = token_kind::user_defined;
  v.kinds[4] = token_kind::control;  // a shorter special that the longer one begins with
  REQUIRE_FALSE(validate(v).has_value());
  const tokenizer t(v);
  // Each stretch of text gets the dummy prefix: " us" merges whole.
  CHECK(t.encode("<|im_start|>us\n", true) == std::vector<int32_t>{1, 3, 10, 8});
  CHECK(t.encode("us</s><s>", false) == std::vector<int32_t>{10, 2, 1});
  // The longest special wins where two start at one place; "<|i" alone is text.
  CHECK(t.encode("<|im", false) == std::vector<int32_t>{4});
  CHECK(t.encode("<|i", false) == std::vector<int32_t>{5, 11, 12, 13});
  // Control tokens decode to nothing, user-defined ones to their piece.
  CHECK(t.decode_all(t.encode("</s>us", false)) == " us");
  CHECK(t.decode_all(t.encode("<|im_start|>us", false)) == "<|im_start|> us");
}

TEST_CASE("a llama2.c vocabulary's BOS and EOS read as <s> and </s>") {
  const tokenizer& t = tok512();
  CHECK(t.vocab().pieces[1] == "<s>");
  CHECK(t.vocab().pieces[2] == "</s>");
  const auto ids = t.encode("Hi</s><s>Hi", false);
  const auto hi = t.encode("Hi", false);
  std::vector<int32_t> want = hi;
  want.push_back(2);
  want.push_back(1);
  want.insert(want.end(), hi.begin(), hi.end());
  CHECK(ids == want);
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

namespace troupe {

TEST_CASE("no token stands for more text than max_text_bytes_per_token: the bound a server refuses long prompts by") {
  auto big = load_llama2c_vocabulary(test::shared_path("models/llama2-tokenizer/tokenizer.bin"), 32000);
  REQUIRE(big.has_value());
  const tokenizer llama2(std::move(big).value());
  for (const tokenizer* t : {&tok512(), &llama2}) {
    const size_t most = t->max_text_bytes_per_token();
    CAPTURE(most);
    CHECK(most >= 4);
    // Texts a token covers the most of: long words, runs of one character, spaces, the
    // pieces themselves, bytes outside the vocabulary.
    std::vector<std::string> texts = {std::string(5000, ' '), std::string(5000, 'a'), std::string(3000, '\n'),
                                      "Once upon a time there was a little girl named Lily who loved to play outside",
                                      "\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81", std::string(2000, '\xff')};
    std::string pieces;
    for (int32_t i = 0; i < t->size(); i += 7) pieces += std::string(t->decode(i, i));
    texts.push_back(pieces);
    for (const std::string& text : texts) {
      const size_t tokens = t->encode(text, false).size();
      CAPTURE(text.size());
      CHECK(tokens * most >= text.size());
    }
    // The bound a gateway takes: the context's worth of the longest pieces, within the cap.
    CHECK(prompt_text_limit(*t, 512, size_t{1} << 20) == std::min<size_t>(512 * most, size_t{1} << 20));
    CHECK(prompt_text_limit(*t, 0, 77) == 77);
  }
}

}  // namespace troupe
