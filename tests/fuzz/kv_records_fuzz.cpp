// KV records as a peer's KV channel or a tier's store (a directory, Redis) hands them back:
// sealed name, length and checksum, then the payload (engine/kv/kv_tiers.hpp). Selector 0:
// the bytes are a record, opened under the name it says it holds, as the KV channel's
// receiver does; selector 1: a name (its length the first byte, mod 64) and then a record,
// opened under that name, as a store's lookup does. A record that opens holds its payload
// within its bytes, under that name, and seals back to the same bytes.
#include <algorithm>
#include <cstring>
#include <string>

#include "engine/kv/kv_tiers.hpp"
#include "tests/fuzz/fuzz_input.hpp"

namespace {

void open_as(std::string_view name, std::span<const std::byte> record) {
  const auto payload = troupe::open_record(name, record);
  if (!payload) return;
  const auto* lo = record.data();
  const auto* hi = record.data() + record.size();
  if (payload->size() > record.size() || (payload->size() > 0 && (payload->data() < lo || payload->data() + payload->size() > hi)))
    __builtin_trap();
  const auto again = troupe::seal_record(name, *payload);
  if (again.size() != record.size() || std::memcmp(again.data(), record.data(), record.size()) != 0) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  troupe::fuzz::input in;
  if (!troupe::fuzz::split(data, size, 2, in)) return 0;
  auto bytes = std::as_bytes(in.rest);
  if (in.selector == 0) {
    if (const auto name = troupe::record_name(bytes)) open_as(*name, bytes);
    return 0;
  }
  if (bytes.empty()) return 0;
  const size_t n = std::min<size_t>(static_cast<size_t>(bytes[0]) % 64, bytes.size() - 1);
  const std::string name(reinterpret_cast<const char*>(bytes.data() + 1), n);
  open_as(name, bytes.subspan(1 + n));
  return 0;
}
