// SentencePiece tokenizer.model files: a small BPE model trained here as Llama's was
// (identity normalization, extra whitespace kept, byte fallback), read into troupe's
// vocabulary, encodes 600 strings to the ids libsentencepiece itself gives; other
// model types and normalizers are refused by name.
#include <fstream>

#include <doctest/doctest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "engine/sample/rng.hpp"
#include "engine/tokenizer/sentencepiece_model.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

const char* const words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "park", "Lily",
                             "Tom", "happy", "big", "red", "ball", "tree", "sun", "day", "said", "went", "saw",
                             "little", "friends", "played", "together", "garden", "flowers", "mother", "wanted",
                             "something", "beautiful", "jumped", "laughed", "river", "morning", "bright", "sky"};

std::string sentence(rng& r, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += r.next() % 7 == 0 ? "  " : " ";
    s += words[r.next() % (sizeof words / sizeof *words)];
    if (r.next() % 9 == 0) s += r.next() % 2 ? "." : ",";
  }
  return s;
}

// Trains a model into DIR/NAME.model: Llama-like but for the model type and normalizer.
std::string train(const test::temp_dir& dir, const std::string& name, const std::string& type = "bpe",
                  const std::string& normalizer = "identity") {
  rng r(5);
  {
    std::ofstream corpus(dir.file("corpus.txt"));
    for (int i = 0; i < 3000; ++i) corpus << sentence(r, 4 + static_cast<int>(r.next() % 12)) << "\n";
  }
  const std::string args = "--input=" + dir.file("corpus.txt") + " --model_prefix=" + dir.file(name) +
                           " --vocab_size=400 --hard_vocab_limit=false --model_type=" + type +
                           " --byte_fallback=true --character_coverage=1.0 --normalization_rule_name=" + normalizer +
                           " --remove_extra_whitespaces=false --minloglevel=2";
  const auto st = sentencepiece::SentencePieceTrainer::Train(args);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  return dir.file(name + ".model");
}

}  // namespace

TEST_CASE("a SentencePiece BPE model encodes as libsentencepiece does, byte fallback included") {
  test::temp_dir dir;
  const std::string path = train(dir, "llama_like");
  auto v = load_sentencepiece_model(path);
  REQUIRE_MESSAGE(v.has_value(), (v ? "" : v.err().message));
  CHECK(v->style == vocab_style::sentencepiece);
  CHECK(v->add_space_prefix);
  const tokenizer tok(*v);
  sentencepiece::SentencePieceProcessor sp;
  REQUIRE(sp.Load(path).ok());
  CHECK(tok.bos_id() == sp.bos_id());
  CHECK(tok.eos_id() == sp.eos_id());
  // The file's bytes (the fuzz target's way in) read the same; other bytes are refused.
  const auto bytes = test::read_all(path);
  auto from_bytes = parse_sentencepiece_model(std::string_view(bytes.data(), bytes.size()), "mem.model");
  REQUIRE(from_bytes.has_value());
  CHECK(from_bytes->pieces == v->pieces);
  CHECK(from_bytes->scores == v->scores);
  auto garbage = parse_sentencepiece_model("not a model", "mem.model");
  REQUIRE_FALSE(garbage.has_value());
  CHECK(garbage.err().message.find("mem.model: not a SentencePiece model") == 0);
  rng r(11);
  int differ = 0;
  for (int i = 0; i < 600; ++i) {
    std::string s = sentence(r, 1 + static_cast<int>(r.next() % 10));
    if (i % 5 == 1) s += " naïve café 😀";     // characters the training text lacks: bytes
    if (i % 7 == 2) s = "   " + s + "\n\n";  // whitespace runs
    std::vector<int> want;
    REQUIRE(sp.Encode(s, &want).ok());
    const std::vector<int32_t> got = tok.encode(s, false);
    if (std::vector<int>(got.begin(), got.end()) != want) {
      ++differ;
      CAPTURE(s);
      CHECK(std::vector<int>(got.begin(), got.end()) == want);
    }
    CHECK(tok.decode_all(tok.encode(s, true)) == s);
  }
  CHECK(differ == 0);
}

TEST_CASE("SentencePiece models troupe's encoder cannot follow are refused by name") {
  test::temp_dir dir;
  auto unigram = load_sentencepiece_model(train(dir, "unigram", "unigram"));
  REQUIRE_FALSE(unigram.has_value());
  CHECK(unigram.err().message.find("unigram model; only BPE models are supported") != std::string::npos);
  auto nfkc = load_sentencepiece_model(train(dir, "nfkc", "bpe", "nmt_nfkc"));
  REQUIRE_FALSE(nfkc.has_value());
  CHECK(nfkc.err().message.find("normalizer 'nmt_nfkc' is not supported") != std::string::npos);
  std::ofstream(dir.file("junk.model")) << "not a model";
  auto junk = load_sentencepiece_model(dir.file("junk.model"));
  REQUIRE_FALSE(junk.has_value());
  CHECK(junk.err().message.find("junk.model: not a SentencePiece model") != std::string::npos);
}

}  // namespace troupe
