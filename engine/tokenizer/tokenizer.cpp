#include "engine/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <cstdio>
#include <queue>

namespace troupe {

tokenizer::tokenizer(vocabulary v) : v_(std::move(v)) {
  ids_.reserve(v_.pieces.size());
  for (int32_t i = 0; i < v_.size(); ++i) ids_.emplace(v_.pieces[i], i);  // first id wins
  for (int& b : byte_ids_) b = -1;
  decoded_.resize(v_.pieces.size());
  for (int32_t i = 0; i < v_.size(); ++i) {
    const std::string& p = v_.pieces[i];
    switch (v_.kinds[i]) {
      case token_kind::byte: {
        unsigned b = 0;
        std::sscanf(p.c_str(), "<0x%2X>", &b);
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

}  // namespace

std::vector<int32_t> tokenizer::encode(std::string_view raw, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos) out.push_back(v_.bos_id);
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
    if (i > from) encode_text(raw.substr(from, i - from), out);
    out.push_back(id);
    i += len;
    from = i;
  }
  if (from < raw.size()) encode_text(raw.substr(from), out);
  return out;
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
  for (size_t s = 0; s < syms.size(); ++s) {
    syms[s].prev = static_cast<int32_t>(s) - 1;
    syms[s].next = s + 1 < syms.size() ? static_cast<int32_t>(s + 1) : -1;
  }

  std::priority_queue<candidate> queue;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = syms[left].next;
    if (right < 0) return;
    const std::string_view merged =
        std::string_view(text).substr(syms[left].start, syms[left].len + syms[right].len);
    auto it = ids_.find(std::string(merged));
    if (it == ids_.end()) return;
    queue.push({v_.scores[it->second], left, syms[left].len, syms[right].len, it->second});
  };
  for (int32_t s = 0; s + 1 < static_cast<int32_t>(syms.size()); ++s) consider(s);
  while (!queue.empty()) {
    const candidate c = queue.top();
    queue.pop();
    symbol& l = syms[c.left];
    if (l.len != c.left_len || l.len == 0 || l.next < 0) continue;
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

std::string_view tokenizer::decode(int32_t prev, int32_t token) const {
  if (token < 0 || token >= v_.size()) return {};
  std::string_view piece = decoded_[token];
  if (prev == v_.bos_id && !piece.empty() && piece[0] == ' ' &&
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
