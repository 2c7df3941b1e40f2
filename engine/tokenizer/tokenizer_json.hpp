// tokenizer_json: a Hugging Face tokenizer.json read into a vocabulary, with the
// tokenizer_config.json beside it when there is one (bos_token, eos_token, add_bos_token).
//
// BPE models only, in either style: byte-level (a ByteLevel pre-tokenizer or decoder:
// Llama 3, Qwen2), whose Split pattern becomes the vocabulary's (GPT-2's when ByteLevel
// splits by itself) and whose NFC normalizer is kept; or SentencePiece-like (byte
// fallback, U+2581 for spaces: Llama 2, Mistral), whose merge ranks become scores. Added
// tokens become control (special) or user-defined pieces. Anything else (another model
// type, normalizer or pattern kind) is an error naming it.
#pragma once

#include <string>
#include <string_view>

#include "engine/tokenizer/vocabulary.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

// vocab_size: the model's embedding rows (0: as many as the file has); a vocabulary with
// more ids is an error, one with fewer is padded with unused pieces.
// The tokenizer_config.json beside it, where there is one, names the special tokens.
expected<vocabulary> load_tokenizer_json(const std::string& path, int32_t vocab_size = 0);
// The same from the two files' text (config_json "" for none); `path` names them in errors.
expected<vocabulary> parse_tokenizer_json(std::string_view tokenizer_json, std::string_view config_json,
                                          const std::string& path, int32_t vocab_size = 0);

// The chat template (Jinja text) of the tokenizer_config.json beside a tokenizer.json, or
// "" when there is none (a list of named templates: the one named "default").
std::string chat_template_beside(const std::string& tokenizer_json_path);

}  // namespace troupe
