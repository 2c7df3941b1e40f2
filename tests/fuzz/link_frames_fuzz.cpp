// The frames a node's own listeners read from strangers, delivered in pieces as a network
// (or an attacker) chooses: selector 0, a step link's steps (actors/step_link.hpp);
// selector 1, a KV channel's hello and then its blocks (engine/kv/kv_channel.hpp). The
// byte after the selector seeds the piece sizes (1 byte to 64 KiB). Whatever the pieces,
// the reader yields the same frames, in order, as with the bytes whole, refuses at the
// same frame, never reads past a frame, and holds no more memory than what arrived
// (twice that and a read's room, for the vector's growth).
#include <cstring>
#include <string>
#include <vector>

#include "actors/step_link.hpp"
#include "engine/kv/kv_channel.hpp"
#include "tests/fuzz/fuzz_input.hpp"

namespace {

struct outcome {
  std::vector<std::string> frames;  // each whole frame's header and body
  std::string refused;              // the refusal that ended the stream, if one did
  bool operator==(const outcome&) const = default;
};

// Feeds `bytes` in pieces (next_piece() bytes at most each, never more than wanted()).
template <class Next>
outcome read_all(bool kv, std::span<const uint8_t> bytes, Next next_piece) {
  outcome out;
  troupe::frame_assembler f = kv ? troupe::kv_hello_frames() : troupe::step_link_frames();
  bool hello = kv;
  size_t at = 0, frame_got = 0;
  while (at < bytes.size()) {
    const size_t n = std::min({next_piece(), f.wanted(), bytes.size() - at});
    if (n == 0) __builtin_trap();  // a frame begun always wants more
    std::memcpy(f.space(), bytes.data() + at, n);
    at += n;
    frame_got += n;
    if (const troupe::status s = f.took(n); !s) {
      out.refused = s.err().message;
      return out;
    }
    if (f.capacity() > 2 * (frame_got + troupe::frame_assembler::min_step) + 64) __builtin_trap();
    if (!f.whole()) continue;
    if (f.frame_bytes() != frame_got) __builtin_trap();  // read exactly to the frame's end
    std::string frame(reinterpret_cast<const char*>(f.header().data()), f.header().size());
    frame.append(reinterpret_cast<const char*>(f.body().data()), f.body().size());
    out.frames.push_back(std::move(frame));
    frame_got = 0;
    if (hello) {
      f = troupe::kv_block_frames(size_t{1} << 20);
      hello = false;
    } else {
      f.next();
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  troupe::fuzz::input in;
  if (!troupe::fuzz::split(data, size, 2, in) || in.rest.empty()) return 0;
  const bool kv = in.selector == 1;
  uint32_t state = in.rest[0] * 2654435761u + 1;
  const auto bytes = in.rest.subspan(1);
  const outcome whole = read_all(kv, bytes, [] { return size_t{1} << 30; });
  const outcome pieces = read_all(kv, bytes, [&state] {
    state = state * 1103515245u + 12345u;
    const uint32_t r = state >> 8;
    return static_cast<size_t>(r % 8 == 0 ? 1 + r % 65536 : 1 + r % 32);
  });
  if (!(whole == pieces)) __builtin_trap();
  return 0;
}
