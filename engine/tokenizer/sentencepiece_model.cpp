#include "engine/tokenizer/sentencepiece_model.hpp"

#include <algorithm>

#include <sentencepiece_processor.h>

namespace troupe {

namespace {

// The few fields of the serialized ModelProto the processor does not expose, read from
// protobuf's wire format: TrainerSpec (field 2) model_type (3), NormalizerSpec (field 3)
// name (1), add_dummy_prefix (3) and remove_extra_whitespaces (4).
struct proto_facts {
  int model_type = 1;  // UNIGRAM=1, BPE=2, WORD=3, CHAR=4
  std::string normalizer;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
};

class wire {
 public:
  wire(const std::string& s, size_t begin, size_t end) : s_(s), at_(begin), end_(end) {}
  bool done() const { return at_ >= end_ || bad_; }
  bool bad() const { return bad_; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ >= end_) return bad_ = true, 0;
      const auto b = static_cast<uint8_t>(s_[at_++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    bad_ = true;
    return 0;
  }
  // The next field: its number and wire type; for length-delimited ones, the bounds.
  bool next(uint32_t& field, uint32_t& type, size_t& begin, size_t& end, uint64_t& value) {
    const uint64_t key = varint();
    if (bad_) return false;
    field = static_cast<uint32_t>(key >> 3);
    type = static_cast<uint32_t>(key & 7);
    switch (type) {
      case 0: value = varint(); break;
      case 1: at_ += 8; break;
      case 5: at_ += 4; break;
      case 2: {
        const uint64_t n = varint();
        if (bad_ || n > end_ - at_) return bad_ = true, false;
        begin = at_;
        end = at_ + n;
        at_ += n;
        break;
      }
      default: return bad_ = true, false;
    }
    if (at_ > end_) bad_ = true;
    return !bad_;
  }

 private:
  const std::string& s_;
  size_t at_, end_;
  bool bad_ = false;
};

proto_facts read_facts(const std::string& s) {
  proto_facts f;
  wire top(s, 0, s.size());
  uint32_t field, type;
  size_t b = 0, e = 0;
  uint64_t v = 0;
  while (!top.done() && top.next(field, type, b, e, v)) {
    if (type != 2 || (field != 2 && field != 3)) continue;
    wire inner(s, b, e);
    uint32_t f2, t2;
    size_t b2 = 0, e2 = 0;
    uint64_t v2 = 0;
    while (!inner.done() && inner.next(f2, t2, b2, e2, v2)) {
      if (field == 2 && f2 == 3 && t2 == 0) f.model_type = static_cast<int>(v2);
      if (field == 3 && f2 == 1 && t2 == 2) f.normalizer = s.substr(b2, e2 - b2);
      if (field == 3 && f2 == 3 && t2 == 0) f.add_dummy_prefix = v2 != 0;
      if (field == 3 && f2 == 4 && t2 == 0) f.remove_extra_whitespaces = v2 != 0;
    }
  }
  return f;
}

expected<vocabulary> vocabulary_of(const sentencepiece::SentencePieceProcessor& sp, const std::string& path,
                                   int32_t vocab_size) {
  const proto_facts facts = read_facts(sp.serialized_model_proto());
  static const char* const types[] = {"?", "unigram", "bpe", "word", "char"};
  if (facts.model_type != 2)
    return error{path + ": a SentencePiece " + std::string(facts.model_type >= 0 && facts.model_type <= 4 ? types[facts.model_type] : "?") +
                 " model; only BPE models are supported"};
  if (!facts.normalizer.empty() && facts.normalizer != "identity")
    return error{path + ": normalizer '" + facts.normalizer + "' is not supported (identity is, as Llama's)"};
  if (facts.remove_extra_whitespaces)
    return error{path + ": the model removes extra whitespace, which troupe's encoder does not (Llama's keeps it)"};
  const int32_t n = sp.GetPieceSize();
  if (vocab_size > 0 && n > vocab_size)
    return error{path + ": " + std::to_string(n) + " pieces, more than the model's " + std::to_string(vocab_size)};
  vocabulary v;
  const std::string space_mark = "\xe2\x96\x81";
  for (int32_t i = 0; i < n; ++i) {
    std::string p = sp.IdToPiece(i);
    token_kind k = token_kind::normal;
    if (sp.IsControl(i)) k = token_kind::control;
    else if (sp.IsUnknown(i)) k = token_kind::unknown;
    else if (sp.IsUnused(i)) k = token_kind::unused;
    else if (sp.IsByte(i)) k = token_kind::byte;
    if (k == token_kind::normal)
      for (size_t at = p.find(space_mark); at != std::string::npos; at = p.find(space_mark, at + 1))
        p.replace(at, space_mark.size(), 1, ' ');
    v.pieces.push_back(std::move(p));
    v.scores.push_back(sp.GetScore(i));
    v.kinds.push_back(k);
  }
  for (int32_t i = n; i < vocab_size; ++i) {
    v.pieces.push_back("<unused_" + std::to_string(i) + ">");
    v.scores.push_back(0.0f);
    v.kinds.push_back(token_kind::unused);
  }
  v.bos_id = sp.bos_id();
  v.eos_id = sp.eos_id();
  v.unk_id = std::max(0, sp.unk_id());
  v.add_bos = v.bos_id >= 0;
  if (v.bos_id < 0) v.bos_id = v.eos_id;
  v.add_space_prefix = facts.add_dummy_prefix;
  if (auto e = validate(v)) return error{path + ": " + *e};
  return v;
}

}  // namespace

expected<vocabulary> load_sentencepiece_model(const std::string& path, int32_t vocab_size) {
  sentencepiece::SentencePieceProcessor sp;
  if (const auto st = sp.Load(path); !st.ok()) return error{path + ": not a SentencePiece model: " + st.ToString()};
  return vocabulary_of(sp, path, vocab_size);
}

expected<vocabulary> parse_sentencepiece_model(std::string_view bytes, const std::string& path, int32_t vocab_size) {
  sentencepiece::SentencePieceProcessor sp;
  if (const auto st = sp.LoadFromSerializedProto(bytes); !st.ok())
    return error{path + ": not a SentencePiece model: " + st.ToString()};
  return vocabulary_of(sp, path, vocab_size);
}

}  // namespace troupe
