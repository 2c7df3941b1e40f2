// prefix_summary: a compact, lossy picture of a replica's prefix cache, for routing. A
// Bloom filter over the chained hashes of the cached blocks (prefix_block_index): about
// ten bits a block, four probes, so a few percent of absent blocks read as present and a
// present one never reads as absent. The router walks a prompt's chain
// (prefix_chain) through it and counts the leading blocks found: the prefix that replica
// is expected to hold.
//
// The hashes are chained from a per-namespace root, so a prompt of one namespace matches
// only that namespace's blocks: a summary says nothing of one tenant's prompts to another
// tenant's requests, and nothing leaves the router.
//
// As words (a CAF message, or anywhere else): the header word (magic, probes, log2 of the
// bits, entries), then the bit words. from_words() checks all of it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace troupe {

class prefix_summary {
 public:
  static constexpr uint32_t probes = 4;
  static constexpr uint32_t min_log2_bits = 10;  // 128 bytes
  static constexpr uint32_t max_log2_bits = 23;  // 1 MiB: a million blocks at 8 bits each

  prefix_summary() : prefix_summary(0) {}
  // Room for `entries` blocks at about ten bits each.
  explicit prefix_summary(size_t entries);

  void add(uint64_t hash);
  bool contains(uint64_t hash) const;
  size_t entries() const { return entries_; }
  size_t size_bytes() const { return bits_.size() * 8; }

  // Leading hashes of `chain` held: the blocks of a prompt's prefix a replica holds.
  size_t leading(std::span<const uint64_t> chain) const;

  std::vector<uint64_t> to_words() const;
  static std::optional<prefix_summary> from_words(std::span<const uint64_t> words);

 private:
  uint32_t log2_bits_ = min_log2_bits;
  size_t entries_ = 0;
  std::vector<uint64_t> bits_;
};

// The chained hashes of the whole blocks of `tokens` a prefix-cache lookup would try (as
// kv_block_manager::match_prefix: never the block holding the last token).
std::vector<uint64_t> prefix_chain(std::span<const int32_t> tokens, uint64_t ns, int32_t block_size);

}  // namespace troupe
