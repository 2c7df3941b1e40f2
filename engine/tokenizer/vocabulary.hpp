// vocabulary: the pieces of a BPE vocabulary with its special ids, in one of two styles.
//
//   sentencepiece: llama2.c tokenizer.bin, GGUF "llama" metadata, or a tokenizer.json
//     with byte fallback; pieces normalised so that a space is ' ' (files store
//     SentencePiece's U+2581), merged by score, bytes as "<0xNN>" pieces.
//   byte_level: GPT-2-style byte-level BPE (Llama 3, Qwen2: tokenizer.json, GGUF
//     "gpt2"); pieces are their raw bytes (files store them through GPT-2's byte-to-
//     character table), merged by the rank of the merge rules, after the text is split by
//     the pre-tokenizer's pattern (and NFC-normalised where the model asks).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/util/expected.hpp"
#include "engine/util/mapped_file.hpp"

namespace troupe {

enum class token_kind : uint8_t { normal, unknown, control, user_defined, unused, byte };

enum class vocab_style : uint8_t { sentencepiece, byte_level };

struct vocabulary {
  vocab_style style = vocab_style::sentencepiece;
  std::vector<std::string> pieces;
  std::vector<float> scores;      // sentencepiece: higher merges first
  std::vector<token_kind> kinds;  // byte tokens are "<0xNN>"
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  int32_t unk_id = 0;
  bool add_space_prefix = true;  // SentencePiece's dummy prefix: " " before the text
  bool add_bos = true;           // whether the model's text starts with bos_id (Qwen2's does not)

  // byte_level only:
  std::vector<std::pair<int32_t, int32_t>> merges;  // the pairs merged, by rank (first: merged first)
  std::string pattern;          // the pre-tokenizer's split pattern (PCRE2, Unicode properties)
  bool nfc = false;             // NFC-normalise the text first
  bool ignore_merges = false;   // a whole split that is a piece is that token, merges or not

  int32_t size() const { return static_cast<int32_t>(pieces.size()); }
};

// Reads a llama2.c tokenizer.bin: int32 max_token_length, then vocab_size records of
// { float score; int32 len; char bytes[len] }. vocab_size comes from the model.
expected<vocabulary> load_llama2c_vocabulary(const std::string& path, int32_t vocab_size);
expected<vocabulary> parse_llama2c_vocabulary(const mapped_file& file, int32_t vocab_size);

// The pre-tokenizer patterns of the byte-level families, as their tokenizer.json files
// write them (llama.cpp's GGUF names: "llama-bpe", "qwen2", "gpt-2").
extern const char* const llama3_pattern;
extern const char* const qwen2_pattern;
extern const char* const gpt2_pattern;

// GPT-2's table between bytes and the characters byte-level vocabularies store them as:
// printable bytes stand for themselves, the others for U+0100 onwards.
std::string byte_level_encode(std::string_view bytes);            // bytes to the stored text
std::optional<std::string> byte_level_decode(std::string_view stored);  // back, or none if a character is not in the table

// "byte-level BPE, 151665 tokens, 151387 merges" or "SentencePiece-style BPE, 32000 tokens",
// for operators.
std::string describe(const vocabulary& v);

// Why a pre-tokenizer pattern does not compile (PCRE2, UTF and Unicode properties), or none.
std::optional<std::string> pattern_error(const std::string& pattern);

// Checks ids and sizes (and a byte-level vocabulary's bytes, merges and pattern); fills
// kinds for byte pieces where the source had none.
std::optional<std::string> validate(vocabulary& v);

}  // namespace troupe
