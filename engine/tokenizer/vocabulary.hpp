// vocabulary: the pieces of a SentencePiece-style BPE vocabulary (llama2.c tokenizer.bin
// or GGUF "llama" tokenizer metadata), normalised so that a space is ' ' (GGUF stores
// SentencePiece's U+2581), with merge scores and special ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/util/expected.hpp"

namespace troupe {

enum class token_kind : uint8_t { normal, unknown, control, user_defined, unused, byte };

struct vocabulary {
  std::vector<std::string> pieces;
  std::vector<float> scores;      // higher merges first
  std::vector<token_kind> kinds;  // byte tokens are "<0xNN>"
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  int32_t unk_id = 0;
  bool add_space_prefix = true;  // SentencePiece's dummy prefix: " " before the text

  int32_t size() const { return static_cast<int32_t>(pieces.size()); }
};

// Reads a llama2.c tokenizer.bin: int32 max_token_length, then vocab_size records of
// { float score; int32 len; char bytes[len] }. vocab_size comes from the model.
expected<vocabulary> load_llama2c_vocabulary(const std::string& path, int32_t vocab_size);

// Checks ids and sizes; fills kinds for byte pieces where the source had none.
std::optional<std::string> validate(vocabulary& v);

}  // namespace troupe
