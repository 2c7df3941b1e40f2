#include "engine/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <queue>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

namespace troupe {

struct tokenizer::regex {
  pcre2_code* code = nullptr;
  ~regex() { pcre2_code_free(code); }
};

namespace {

pcre2_code* compile(const std::string& pattern, std::string* why) {
  int err = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &at, nullptr);
  if (!code && why) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    *why = std::string(reinterpret_cast<const char*>(msg)) + " at offset " + std::to_string(at);
  }
  if (code) pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // (interpreted where JIT is unavailable)
  return code;
}

// Well-formed UTF-8: no stray continuation bytes, no overlong forms, no surrogates, no
// code points past U+10FFFF (what PCRE2 requires of a subject).
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xe0) == 0xc0) n = 2, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) n = 3, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) n = 4, cp = c & 0x07;
    else return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<uint8_t>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

// The byte a byte token's text "<0xHH>" names, or -1 for any other text.
int byte_of_piece(const std::string& p) {
  if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(p[3]), lo = hex(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

std::optional<std::string> pattern_error(const std::string& pattern) {
  std::string why;
  pcre2_code* code = compile(pattern, &why);
  if (!code) return why;
  pcre2_code_free(code);
  return std::nullopt;
}

tokenizer::tokenizer(vocabulary v) : v_(std::move(v)) {
  ids_.reserve(v_.pieces.size());
  for (int32_t i = 0; i < v_.size(); ++i) ids_.emplace(v_.pieces[i], i);  // first id wins
  for (int& b : byte_ids_) b = -1;
  decoded_.resize(v_.pieces.size());
  for (int32_t i = 0; i < v_.size(); ++i) {
    const std::string& p = v_.pieces[i];
    switch (v_.kinds[i]) {
      case token_kind::byte: {
        const int b = byte_of_piece(p);
        if (b < 0) {  // a byte token whose text names no byte ("<0x-4>"): its text, as any piece
          decoded_[i] = p;
          break;
        }
        if (byte_ids_[b] < 0) byte_ids_[b] = i;
        decoded_[i] = std::string(1, static_cast<char>(b));
        break;
      }
      case token_kind::control:
      case token_kind::unused:
        break;  // decodes to nothing
      default:
        decoded_[i] = p;
    }
    if ((v_.kinds[i] == token_kind::control || v_.kinds[i] == token_kind::user_defined) && !p.empty()) {
      specials_.emplace_back(p, i);
      special_starts_[static_cast<unsigned char>(p[0])] = true;
    }
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const std::string& p : v_.pieces) max_text_bytes_ = std::max(max_text_bytes_, p.size());
  if (v_.nfc) max_text_bytes_ *= 3;
  if (v_.style == vocab_style::byte_level) {
    auto r = std::make_shared<regex>();
    std::string why;
    r->code = compile(v_.pattern, &why);
    TROUPE_ASSERT(r->code != nullptr, why, "(validate() checks the pattern)");
    pattern_ = std::move(r);
    for (int32_t i = 0; i < v_.size(); ++i)
      if (v_.pieces[i].size() == 1 && v_.kinds[i] == token_kind::normal && byte_ids_[static_cast<uint8_t>(v_.pieces[i][0])] < 0)
        byte_ids_[static_cast<uint8_t>(v_.pieces[i][0])] = i;
    ranks_.reserve(v_.merges.size());
    for (size_t rank = 0; rank < v_.merges.size(); ++rank) {
      const auto [a, b] = v_.merges[rank];
      auto merged = ids_.find(v_.pieces[a] + v_.pieces[b]);
      if (merged == ids_.end()) continue;  // a rule whose result is no piece never applies
      ranks_.emplace((uint64_t(uint32_t(a)) << 32) | uint32_t(b), std::pair{static_cast<int32_t>(rank), merged->second});
    }
  }
}

int32_t tokenizer::find(std::string_view piece) const {
  auto it = ids_.find(std::string(piece));
  return it == ids_.end() ? -1 : it->second;
}

namespace {

size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xe0) == 0xc0) return 2;
  if ((lead & 0xf0) == 0xe0) return 3;
  if ((lead & 0xf8) == 0xf0) return 4;
  return 1;  // stray continuation or invalid byte: a symbol of its own
}

struct symbol {
  size_t start, len;  // bytes of the text this symbol covers
  int32_t id;
  int32_t prev, next;  // neighbours in the live list, -1 at the ends
};

struct candidate {
  float score;
  int32_t left;      // symbol index; symbols keep their text order
  size_t left_len, right_len;  // to detect stale entries
  int32_t id;
  bool operator<(const candidate& o) const {
    if (score != o.score) return score < o.score;  // higher score first
    return left > o.left;                          // then leftmost
  }
};

// BPE over a list of symbols: links them, then repeatedly merges the adjacent pair that
// `pair(left, right)` scores highest (leftmost on ties), as {score, merged id}, until no
// pair has a score; appends the ids left. Both vocabulary styles merge this way, scored
// by piece score or by merge rank.
template <class Pair>
void merge_pairs(std::vector<symbol>& syms, Pair pair, std::vector<int32_t>& out) {
  for (size_t s = 0; s < syms.size(); ++s) {
    syms[s].prev = static_cast<int32_t>(s) - 1;
    syms[s].next = s + 1 < syms.size() ? static_cast<int32_t>(s + 1) : -1;
  }
  std::priority_queue<candidate> queue;
  auto consider = [&](int32_t left) {
    if (left < 0 || syms[left].next < 0) return;
    const symbol& l = syms[left];
    const symbol& r = syms[l.next];
    if (const auto m = pair(l, r)) queue.push({m->first, left, l.len, r.len, m->second});
  };
  for (int32_t s = 0; s + 1 < static_cast<int32_t>(syms.size()); ++s) consider(s);
  while (!queue.empty()) {
    const candidate c = queue.top();
    queue.pop();
    symbol& l = syms[c.left];
    if (l.len != c.left_len || l.len == 0 || l.next < 0) continue;  // stale: a side merged since
    symbol& r = syms[l.next];
    if (r.len != c.right_len) continue;
    l.len += r.len;
    l.id = c.id;
    r.len = 0;  // dead
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t s = syms.empty() ? -1 : 0; s >= 0; s = syms[s].next) out.push_back(syms[s].id);
}

}  // namespace

std::vector<int32_t> tokenizer::encode(std::string_view raw, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos && v_.add_bos) out.push_back(v_.bos_id);
  // Special pieces in the text stand for their tokens; the text between them is merged on
  // its own, each stretch with the dummy prefix.
  size_t from = 0;
  for (size_t i = 0; i < raw.size();) {
    size_t len = 0;
    int32_t id = -1;
    if (special_starts_[static_cast<unsigned char>(raw[i])])
      for (const auto& [piece, sid] : specials_)
        if (raw.compare(i, piece.size(), piece) == 0) {
          len = piece.size();
          id = sid;
          break;  // the longest first
        }
    if (id < 0) {
      ++i;
      continue;
    }
    if (i > from) encode_stretch(raw.substr(from, i - from), out);
    out.push_back(id);
    i += len;
    from = i;
  }
  if (from < raw.size()) encode_stretch(raw.substr(from), out);
  return out;
}

void tokenizer::encode_stretch(std::string_view text, std::vector<int32_t>& out) const {
  if (v_.style == vocab_style::byte_level)
    encode_byte_level(text, out);
  else
    encode_text(text, out);
}

void tokenizer::encode_byte_level(std::string_view raw, std::vector<int32_t>& out) const {
  std::string normalized;
  if (v_.nfc) {
    // utf8proc refuses invalid UTF-8; such text is split and merged as it is.
    utf8proc_uint8_t* nfc = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(raw.data()),
                                            static_cast<utf8proc_ssize_t>(raw.size()), &nfc,
                                            static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n >= 0) {
      normalized.assign(reinterpret_cast<const char*>(nfc), static_cast<size_t>(n));
      raw = normalized;
    }
    std::free(nfc);
  }
  // Text that is not UTF-8 (only bytes from outside can be) is one split, merged as bytes.
  if (!valid_utf8(raw)) return merge_by_rank(raw, out);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(pattern_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(raw.data());
  size_t at = 0;
  while (at < raw.size()) {
    int rc = pcre2_match(pattern_->code, subject, raw.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
    // A match too deep for the JIT's stack (a very long run) goes to the interpreter,
    // whose frames live on the heap.
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
      rc = pcre2_match(pattern_->code, subject, raw.size(), at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    if (rc < 0) {  // no more matches (or none the matcher can find): the rest is one split
      merge_by_rank(raw.substr(at), out);
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[0] > at) merge_by_rank(raw.substr(at, ov[0] - at), out);  // text between matches
    if (ov[1] == ov[0]) {  // an empty match: step over one character
      size_t n = utf8_length(static_cast<unsigned char>(raw[ov[0]]));
      n = std::min(n, raw.size() - ov[0]);
      merge_by_rank(raw.substr(ov[0], n), out);
      at = ov[0] + n;
      continue;
    }
    merge_by_rank(raw.substr(ov[0], ov[1] - ov[0]), out);
    at = ov[1];
  }
  pcre2_match_data_free(md);
}

void tokenizer::merge_by_rank(std::string_view split, std::vector<int32_t>& out) const {
  if (split.empty()) return;
  if (v_.ignore_merges) {
    const int32_t whole = find(split);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  std::vector<symbol> syms;
  syms.reserve(split.size());
  for (size_t i = 0; i < split.size(); ++i) syms.push_back({i, 1, byte_ids_[static_cast<unsigned char>(split[i])], -1, -1});
  merge_pairs(
      syms,
      [&](const symbol& l, const symbol& r) -> std::optional<std::pair<float, int32_t>> {
        auto it = ranks_.find((uint64_t(uint32_t(l.id)) << 32) | uint32_t(r.id));
        if (it == ranks_.end()) return std::nullopt;
        return std::pair{-static_cast<float>(it->second.first), it->second.second};  // lower rank first
      },
      out);
}

void tokenizer::encode_text(std::string_view raw, std::vector<int32_t>& out) const {
  std::string text;
  text.reserve(raw.size() + 1);
  if (v_.add_space_prefix) text.push_back(' ');
  text.append(raw);

  std::vector<symbol> syms;
  for (size_t i = 0; i < text.size();) {
    size_t n = utf8_length(static_cast<unsigned char>(text[i]));
    if (i + n > text.size()) n = 1;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) n = 1;
    const int32_t id = find(std::string_view(text).substr(i, n));
    if (id >= 0) {
      syms.push_back({i, n, id, -1, -1});
    } else {
      for (size_t k = 0; k < n; ++k) {
        const int32_t b = byte_ids_[static_cast<unsigned char>(text[i + k])];
        syms.push_back({i + k, 1, b >= 0 ? b : v_.unk_id, -1, -1});
      }
    }
    i += n;
  }
  merge_pairs(
      syms,
      [&](const symbol& l, const symbol& r) -> std::optional<std::pair<float, int32_t>> {
        auto it = ids_.find(text.substr(l.start, l.len + r.len));
        if (it == ids_.end()) return std::nullopt;
        return std::pair{v_.scores[it->second], it->second};
      },
      out);
}

std::string_view tokenizer::decode(int32_t prev, int32_t token) const {
  if (token < 0 || token >= v_.size()) return {};
  std::string_view piece = decoded_[token];
  if (v_.add_space_prefix && prev == v_.bos_id && !piece.empty() && piece[0] == ' ' &&
      v_.kinds[token] != token_kind::byte)
    piece.remove_prefix(1);
  return piece;
}

std::string tokenizer::decode_all(const std::vector<int32_t>& tokens) const {
  std::string s;
  int32_t prev = v_.bos_id;
  for (int32_t t : tokens) {
    s += decode(prev, t);
    prev = t;
  }
  return s;
}

}  // namespace troupe
