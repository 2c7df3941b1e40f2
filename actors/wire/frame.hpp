// frame: Cap'n Proto messages in standard stream framing, checked before the library
// reads them. A frame from outside (a socket, another process) may be truncated, claim
// absurd segment counts (Cap'n Proto 0.9.2 mishandles 0xFFFFFFFF), or point anywhere;
// frame_reader checks the segment table against the bytes it has and gives the reader a
// traversal and nesting limit sized for the protocol, never a global one.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <capnp/any.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>

#include "engine/kv/block_id.hpp"
#include "engine/util/expected.hpp"

namespace troupe::wire {

// Limits of one protocol's messages.
struct frame_limits {
  size_t max_bytes = 1 << 20;       // whole frame
  uint32_t max_segments = 16;
  uint64_t traversal_words = 1 << 17;
  int nesting = 16;

  // A flat message of at most max_bytes: every word read at most twice, nesting 8.
  static frame_limits flat(size_t max_bytes) {
    frame_limits fl;
    fl.max_bytes = max_bytes;
    fl.traversal_words = max_bytes / 8 * 2;
    fl.nesting = 8;
    return fl;
  }
};

// A message received as bytes: owns an aligned copy and a reader over it.
class frame_reader {
 public:
  static expected<std::unique_ptr<frame_reader>> parse(std::span<const uint8_t> bytes, const frame_limits& lim);

  template <class T>
  typename T::Reader root() { return reader_->getRoot<T>(); }

 private:
  frame_reader() = default;
  kj::Array<capnp::word> words_;  // (capnp::word cannot be copied or moved: no std::vector)
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
};

// A built message in stream framing.
std::vector<uint8_t> to_bytes(capnp::MessageBuilder& b);

// float32 values as a Data field's bytes (little-endian, as this machine stores them):
// `init` makes the field of so many bytes (nothing is made for none), and its reading,
// which must hold exactly `count` floats (the error says "N `what` where M are expected").
template <typename Init>
void write_floats(Init&& init, std::span<const float> values) {
  if (values.empty()) return;
  auto d = init(static_cast<unsigned>(values.size_bytes()));
  std::memcpy(d.begin(), values.data(), values.size_bytes());
}
expected<std::vector<float>> read_floats(capnp::Data::Reader d, int64_t count, const std::string& what);

// KV tiers: the requests whose loads failed, at most `most` of them, none twice.
expected<std::vector<request_id>> read_failed_loads(capnp::List<uint64_t>::Reader ids, int64_t most);

}  // namespace troupe::wire
