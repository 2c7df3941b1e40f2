#include "engine/tokenizer/utf8_stream.hpp"

namespace troupe {

namespace {

constexpr std::string_view replacement = "\xef\xbf\xbd";

// Length of the sequence a lead byte starts, 0 if it cannot start one.
size_t sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xc2 && b <= 0xdf) return 2;
  if ((b & 0xf0) == 0xe0) return 3;
  if (b >= 0xf0 && b <= 0xf4) return 4;
  return 0;
}

bool is_continuation(unsigned char b) { return (b & 0xc0) == 0x80; }

// Rejects overlong, surrogate and out-of-range forms by the second byte.
bool second_byte_ok(unsigned char lead, unsigned char b) {
  if (!is_continuation(b)) return false;
  if (lead == 0xe0) return b >= 0xa0;
  if (lead == 0xed) return b <= 0x9f;
  if (lead == 0xf0) return b >= 0x90;
  if (lead == 0xf4) return b <= 0x8f;
  return true;
}

}  // namespace

std::string utf8_stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const auto lead = static_cast<unsigned char>(pending_[i]);
    const size_t n = sequence_length(lead);
    if (n == 0) {
      out.append(replacement);
      ++i;
      continue;
    }
    size_t have = 1;
    bool bad = false;
    while (have < n && i + have < pending_.size()) {
      const auto b = static_cast<unsigned char>(pending_[i + have]);
      if (have == 1 ? !second_byte_ok(lead, b) : !is_continuation(b)) {
        bad = true;
        break;
      }
      ++have;
    }
    if (bad) {
      out.append(replacement);
      i += have;
      continue;
    }
    if (have < n) break;  // unfinished: wait for more bytes
    out.append(pending_, i, n);
    i += n;
  }
  pending_.erase(0, i);
  return out;
}

std::string utf8_stream::finish() {
  std::string out = push({});
  if (!pending_.empty()) out.append(replacement);
  pending_.clear();
  return out;
}

}  // namespace troupe
