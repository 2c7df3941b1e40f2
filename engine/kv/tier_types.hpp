// tier_types: what names a KV tier and a block in it, apart from the stores
// (engine/kv/kv_tiers.hpp), for the configuration and the step plans that carry them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "engine/kv/block_id.hpp"

namespace troupe {

enum class tier_kind : uint8_t { host, disk, redis };
std::string_view tier_kind_name(tier_kind k);
std::optional<tier_kind> parse_tier_kind(std::string_view s);

struct tier_config {
  tier_kind kind = tier_kind::host;
  uint64_t capacity_bytes = 0;  // host, disk: the most bytes it holds, the least recently
                                // used dropped first (0: the default, 1 GiB); redis: unused
                                // (the server's maxmemory policy decides)
  std::string path;             // disk: the directory (made if missing)
  std::string address;          // redis: HOST:PORT
  int32_t timeout_ms = 100;     // redis: connecting and each command
};
inline constexpr uint64_t default_tier_capacity = uint64_t{1} << 30;

// What is wrong with a tier's settings, or nullopt.
std::optional<std::string> validate(const tier_config& c);

// A block's content address: the chained hash of its whole prefix (tokens up to the
// block's end) under a namespace, 128 bits, so that two prefixes never share a name.
struct tier_key {
  uint64_t hi = 0, lo = 0;
  bool operator==(const tier_key&) const = default;
  static tier_key root(uint64_t ns);  // the empty prefix's
  tier_key chain(std::span<const int32_t> block) const;
  std::string hex() const;  // 32 hex digits
};

// KV tiers: a block of a request's table, copied between the shards' caches and the tiers
// (engine/kv/kv_tiers.hpp) under its content address.
struct tier_move {
  request_id id;
  block_id block;
  tier_key key;
  std::string to = {};  // disaggregation's pushes: the decode replica it goes to
};

}  // namespace troupe
