#include "actors/wire/frame.hpp"

#include <unordered_set>

#include <cstring>

#include <kj/exception.h>

namespace troupe::wire {

expected<std::unique_ptr<frame_reader>> frame_reader::parse(std::span<const uint8_t> bytes,
                                                           const frame_limits& lim) {
  if (bytes.size() > lim.max_bytes)
    return error{"frame of " + std::to_string(bytes.size()) + " bytes exceeds the limit of " + std::to_string(lim.max_bytes)};
  if (bytes.size() < 8 || bytes.size() % 8 != 0)
    return error{"frame of " + std::to_string(bytes.size()) + " bytes is not a whole number of words"};
  // Segment table: u32 (count - 1), then count u32 sizes in words, padded to a word.
  uint32_t count_minus_one = 0;
  std::memcpy(&count_minus_one, bytes.data(), 4);
  if (count_minus_one >= lim.max_segments)
    return error{"frame claims " + std::to_string(uint64_t{count_minus_one} + 1) + " segments; at most " +
                 std::to_string(lim.max_segments) + " are allowed"};
  const uint64_t count = uint64_t{count_minus_one} + 1;
  const uint64_t table_bytes = (4 + 4 * count + 7) / 8 * 8;
  if (table_bytes > bytes.size()) return error{"frame is truncated inside its segment table"};
  uint64_t words = 0;
  for (uint64_t s = 0; s < count; ++s) {
    uint32_t size = 0;
    std::memcpy(&size, bytes.data() + 4 + 4 * s, 4);
    words += size;
  }
  if (table_bytes + words * 8 != bytes.size())
    return error{"frame's segment table describes " + std::to_string(table_bytes + words * 8) +
                 " bytes, the frame has " + std::to_string(bytes.size())};
  std::unique_ptr<frame_reader> f(new frame_reader);
  f->words_ = kj::heapArray<capnp::word>(bytes.size() / 8);
  std::memcpy(f->words_.begin(), bytes.data(), bytes.size());
  capnp::ReaderOptions opts;
  opts.traversalLimitInWords = lim.traversal_words;
  opts.nestingLimit = lim.nesting;
  try {
    f->reader_ = std::make_unique<capnp::FlatArrayMessageReader>(f->words_.asPtr(), opts);
    // Every protocol's root is a struct: one whose pointer is out of bounds, or not a struct
    // pointer, is refused here, before a decoder's root<T>() would throw outside its guard.
    (void)f->reader_->getRoot<capnp::AnyStruct>();
  } catch (const kj::Exception& e) {
    return error{std::string("malformed frame: ") + e.getDescription().cStr()};
  }
  return f;
}

std::vector<uint8_t> to_bytes(capnp::MessageBuilder& b) {
  const auto flat = capnp::messageToFlatArray(b);
  const auto bytes = flat.asBytes();
  return {bytes.begin(), bytes.end()};
}

expected<std::vector<float>> read_floats(capnp::Data::Reader d, int64_t count, const std::string& what) {
  if (d.size() != static_cast<size_t>(count) * sizeof(float))
    return error{std::to_string(d.size() / sizeof(float)) + " " + what + " where " + std::to_string(count) + " are expected"};
  std::vector<float> out(static_cast<size_t>(count));
  if (count > 0) std::memcpy(out.data(), d.begin(), d.size());
  return out;
}

expected<std::vector<request_id>> read_failed_loads(capnp::List<uint64_t>::Reader ids, int64_t most) {
  if (static_cast<int64_t>(ids.size()) > most)
    return error{std::to_string(ids.size()) + " requests with failed loads; at most " + std::to_string(most)};
  std::vector<request_id> out;
  std::unordered_set<uint64_t> seen;
  for (uint64_t id : ids) {
    if (!seen.insert(id).second) return error{"request " + std::to_string(id) + " named twice among failed loads"};
    out.push_back(request_id{id});
  }
  return out;
}

}  // namespace troupe::wire
