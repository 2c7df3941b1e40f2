// sentencepiece_model: a SentencePiece tokenizer.model (the file Llama 2 and Mistral ship)
// read through Debian's libsentencepiece into a sentencepiece-style vocabulary: pieces,
// scores, kinds (control, unknown, unused, byte), special ids and the dummy prefix.
//
// troupe's own encoder then runs it, which computes what SentencePiece computes for BPE
// models whose normalizer changes nothing (Llama's: "identity", extra whitespace kept).
// Other models (unigram, word, char) and normalizers are an error naming them.
#pragma once

#include <string>
#include <string_view>

#include "engine/tokenizer/vocabulary.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

// vocab_size: the model's embedding rows (0: the file's piece count); a file with more
// pieces is an error, one with fewer is padded with unused pieces.
expected<vocabulary> load_sentencepiece_model(const std::string& path, int32_t vocab_size = 0);
// The same from the file's bytes; `path` names them in errors.
expected<vocabulary> parse_sentencepiece_model(std::string_view bytes, const std::string& path, int32_t vocab_size = 0);

}  // namespace troupe
