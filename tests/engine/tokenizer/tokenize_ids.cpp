// tokenize_ids TOKENIZER CORPUS.json OUT.json: encodes every string of CORPUS (a JSON
// array) with troupe's tokenizer for TOKENIZER (a tokenizer.json, or a GGUF file's
// vocabulary), without BOS, and writes {"ids": [[...], ...], "decoded": ["...", ...]}
// (each string's ids decoded back). tests/tools/tokenizers_test.py compares them with an
// independent tokenizer.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/model/model.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "engine/tokenizer/tokenizer_json.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tokenize_ids TOKENIZER CORPUS.json OUT.json\n");
    return 2;
  }
  const std::string path = argv[1];
  std::optional<vocabulary> v;
  if (path.ends_with(".json")) {
    auto j = load_tokenizer_json(path);
    if (!j) {
      std::fprintf(stderr, "tokenize_ids: %s\n", j.err().message.c_str());
      return 1;
    }
    v = std::move(j).value();
  } else {
    auto m = load_model(path);
    if (!m || !m->vocab) {
      std::fprintf(stderr, "tokenize_ids: %s\n", m ? "the model has no vocabulary" : m.err().message.c_str());
      return 1;
    }
    v = *m->vocab;
  }
  const tokenizer tok(std::move(*v));
  std::ifstream in(argv[2], std::ios::binary);
  const nlohmann::json corpus = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}), nullptr, false);
  if (!corpus.is_array()) {
    std::fprintf(stderr, "tokenize_ids: %s is not a JSON array\n", argv[2]);
    return 1;
  }
  nlohmann::json ids = nlohmann::json::array(), decoded = nlohmann::json::array();
  for (const auto& s : corpus) {
    const auto t = tok.encode(s.get<std::string>(), false);
    ids.push_back(t);
    decoded.push_back(tok.decode_all(t));
  }
  std::ofstream out(argv[3], std::ios::binary);
  out << nlohmann::json{{"ids", ids}, {"decoded", decoded}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return out ? 0 : 1;
}
