#include "engine/kv/prefix_summary.hpp"

#include <algorithm>
#include <bit>

#include "engine/kv/prefix_block_index.hpp"

namespace troupe {

namespace {

constexpr uint64_t magic = 0x7073;  // "ps"

// The probe positions of a hash: double hashing over a remix, so that related chain
// hashes spread.
struct probe_walk {
  uint64_t a, b;
  explicit probe_walk(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    a = h;
    b = (h >> 32 | h << 32) | 1;
  }
  uint64_t at(uint32_t i) const { return a + i * b; }
};

}  // namespace

prefix_summary::prefix_summary(size_t entries) {
  const uint64_t want = std::max<uint64_t>(uint64_t{1} << min_log2_bits, uint64_t{entries} * 10);
  log2_bits_ = std::clamp<uint32_t>(static_cast<uint32_t>(std::bit_width(want - 1)), min_log2_bits, max_log2_bits);
  bits_.assign((size_t{1} << log2_bits_) / 64, 0);
}

void prefix_summary::add(uint64_t hash) {
  const probe_walk w(hash);
  const uint64_t mask = (uint64_t{1} << log2_bits_) - 1;
  for (uint32_t i = 0; i < probes; ++i) {
    const uint64_t bit = w.at(i) & mask;
    bits_[bit / 64] |= uint64_t{1} << (bit % 64);
  }
  ++entries_;
}

bool prefix_summary::contains(uint64_t hash) const {
  const probe_walk w(hash);
  const uint64_t mask = (uint64_t{1} << log2_bits_) - 1;
  for (uint32_t i = 0; i < probes; ++i) {
    const uint64_t bit = w.at(i) & mask;
    if (!(bits_[bit / 64] >> (bit % 64) & 1)) return false;
  }
  return true;
}

size_t prefix_summary::leading(std::span<const uint64_t> chain) const {
  size_t n = 0;
  while (n < chain.size() && contains(chain[n])) ++n;
  return n;
}

std::vector<uint64_t> prefix_summary::to_words() const {
  std::vector<uint64_t> out;
  out.reserve(bits_.size() + 1);
  out.push_back(magic << 48 | uint64_t{probes} << 40 | uint64_t{log2_bits_} << 32 | std::min<uint64_t>(entries_, 0xffffffffu));
  out.insert(out.end(), bits_.begin(), bits_.end());
  return out;
}

std::optional<prefix_summary> prefix_summary::from_words(std::span<const uint64_t> words) {
  if (words.empty()) return std::nullopt;
  const uint64_t head = words[0];
  const auto log2_bits = static_cast<uint32_t>(head >> 32 & 0xff);
  if (head >> 48 != magic || (head >> 40 & 0xff) != probes || log2_bits < min_log2_bits || log2_bits > max_log2_bits)
    return std::nullopt;
  if (words.size() != 1 + (size_t{1} << log2_bits) / 64) return std::nullopt;
  prefix_summary s;
  s.log2_bits_ = log2_bits;
  s.entries_ = head & 0xffffffffu;
  s.bits_.assign(words.begin() + 1, words.end());
  return s;
}

std::vector<uint64_t> prefix_chain(std::span<const int32_t> tokens, uint64_t ns, int32_t block_size) {
  std::vector<uint64_t> chain;
  if (tokens.empty() || block_size <= 0) return chain;
  const size_t blocks = (tokens.size() - 1) / static_cast<size_t>(block_size);
  chain.reserve(blocks);
  uint64_t parent = prefix_block_index::root(ns);
  for (size_t b = 0; b < blocks; ++b) {
    parent = prefix_block_index::chain(parent, tokens.subspan(b * block_size, block_size));
    chain.push_back(parent);
  }
  return chain;
}

}  // namespace troupe
