// Strong ids for KV blocks and requests, so one cannot be passed as the other.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace troupe {

struct block_id {
  uint32_t value = 0;
  auto operator<=>(const block_id&) const = default;
};

struct request_id {
  uint64_t value = 0;
  auto operator<=>(const request_id&) const = default;
};

}  // namespace troupe

template <>
struct std::hash<troupe::request_id> {
  size_t operator()(troupe::request_id r) const noexcept { return std::hash<uint64_t>{}(r.value); }
};
