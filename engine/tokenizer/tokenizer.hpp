// tokenizer: SentencePiece-style BPE over a vocabulary (engine/tokenizer/vocabulary.hpp).
//
// encode: the pieces of control and user-defined tokens found in the text ("<s>",
// "<|im_start|>", ... as chat templates write them) become those tokens, the longest
// first; each stretch of text between them (with SentencePiece's dummy-prefix space when
// the vocabulary asks for it, as llama.cpp does) is split into UTF-8 characters; a
// character missing from the vocabulary falls back to its bytes as <0xNN> tokens; then
// adjacent pairs whose concatenation is a piece are merged, the highest-scoring pair first
// (the leftmost on ties), until none is left.
// decode: a token's piece as bytes; <0xNN> pieces become the byte; control tokens (BOS,
// EOS) become nothing; after BOS a leading space is dropped (the dummy prefix).
//
// Byte-level vocabularies (Llama 3, Qwen2) encode differently: the text between special
// pieces is NFC-normalised where the vocabulary asks, split by its pre-tokenizer pattern
// (PCRE2 with Unicode properties), and each split, as bytes, merged pair by pair in the
// order of the merge rules (lowest rank first, leftmost on ties); a split that is a piece
// is that piece where the vocabulary ignores merges. Such pieces decode to their bytes.
//
// Immutable after construction; safe to share between threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/tokenizer/vocabulary.hpp"

namespace troupe {

class tokenizer {
 public:
  // v must have passed validate() (a byte-level pattern that compiles included).
  explicit tokenizer(vocabulary v);

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;

  // The bytes of token `token` when it follows `prev` (which decides the leading-space rule).
  std::string_view decode(int32_t prev, int32_t token) const;
  std::string decode_all(const std::vector<int32_t>& tokens) const;

  const vocabulary& vocab() const { return v_; }
  int32_t bos_id() const { return v_.bos_id; }
  // 1 if `ids` start with BOS (a prompt encode() began with one), else 0: Qwen2's text has none.
  int32_t leading_bos(std::span<const int32_t> ids) const { return !ids.empty() && ids[0] == v_.bos_id ? 1 : 0; }
  int32_t eos_id() const { return v_.eos_id; }
  int32_t size() const { return v_.size(); }
  int32_t find(std::string_view piece) const;  // -1 if absent
  // The most bytes of text one token can stand for: the longest piece (a special token's
  // text included; a piece is never shorter than the text it covers, whose spaces it
  // writes as 3-byte U+2581, whose bytes a byte-level piece maps to 1 or 2), at least 4 (a
  // character's bytes), three times that where the text is NFC-normalised first (which
  // composes up to three characters into one). A text longer than this times N bytes has
  // more than N tokens: what a server checks before it tokenizes.
  size_t max_text_bytes_per_token() const { return max_text_bytes_; }

 private:
  struct regex;  // the compiled pre-tokenizer pattern (PCRE2)

  vocabulary v_;
  void encode_stretch(std::string_view text, std::vector<int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void encode_byte_level(std::string_view text, std::vector<int32_t>& out) const;
  void merge_by_rank(std::string_view split, std::vector<int32_t>& out) const;

  std::shared_ptr<const regex> pattern_;
  // Byte-level merges: (left id, right id) -> rank and merged id.
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> ranks_;

  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // control and user-defined pieces, longest first
  bool special_starts_[256] = {};                          // first bytes of those pieces
  int32_t byte_ids_[256];
  std::vector<std::string> decoded_;  // what decode() yields for each token
  size_t max_text_bytes_ = 4;
};

// The most bytes of prompt text worth tokenizing for a context of `context` tokens (0 or
// less: no context bound), and at most `cap`: a longer text has more tokens than the
// context holds, so a server refuses it before spending the CPU to find out.
inline size_t prompt_text_limit(const tokenizer& tok, int32_t context, size_t cap) {
  if (context <= 0) return cap;
  return std::min(cap, static_cast<size_t>(context) * tok.max_text_bytes_per_token());
}

}  // namespace troupe
