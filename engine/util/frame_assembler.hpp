// frame_assembler: one length-prefixed frame of troupe's own links (a step link's step, a
// KV channel's record) put together from bytes as they arrive, whatever pieces the network
// delivers them in. A reader that owns a connection asks how many bytes the frame still
// wants, reads at most that many into space(), and reports them with took(); once the
// header is whole it is checked (a bad header is an error, and the connection is over),
// and the body follows. The buffer grows with the bytes that arrived, never to the length
// a header announced: a stranger that announces 64 MiB and sends one byte holds one
// chunk, not 64 MiB.
//
//   empty --first byte--> header --header whole and valid--> body --last byte--> whole
//     ^                                                                           |
//     +------------------------------- next() ------------------------------------+
//
// Never reads past the frame it is in (so nothing is left over between frames). Plain
// data: one thread at a time. The deadline of a frame is its reader's (frame_deadline).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/util/expected.hpp"

namespace troupe {

class frame_assembler {
 public:
  // Checks a whole header; the body's length, or why the header is refused.
  using body_fn = std::function<expected<size_t>(std::span<const uint8_t> header)>;
  // The most bytes the buffer grows by ahead of what arrived (one read's worth); it grows
  // by as much again as arrived, from min_step up to the chunk.
  static constexpr size_t default_chunk = size_t{1} << 20;
  static constexpr size_t min_step = 4096;

  frame_assembler(size_t header_bytes, body_fn body_of, size_t chunk = default_chunk);

  // How many bytes the next read may take: the rest of the header, or of the body, as
  // much again as arrived (at least min_step, at most one chunk); 0 when the frame is whole.
  size_t wanted() const;
  // Room for `wanted()` bytes (or fewer) at the end of what arrived.
  uint8_t* space();
  // n bytes (at most wanted()) were read into space(). An error when they complete a
  // header that is refused; the assembler is then done with this connection.
  status took(size_t n);

  bool begun() const { return got_ > 0; }
  bool whole() const { return got_ > 0 && wanted() == 0; }
  // Header and body bytes in all, once the header is known (the header alone before).
  size_t frame_bytes() const { return header_bytes_ + (header_known_ ? body_bytes_ : 0); }
  std::span<const uint8_t> header() const { return {buf_.data(), header_bytes_}; }
  std::span<const uint8_t> body() const { return {buf_.data() + header_bytes_, body_bytes_}; }
  // Bytes held in memory (what arrived, and room for one more read).
  size_t capacity() const { return buf_.capacity(); }
  // The whole frame taken: the next begins. Keeps at most one chunk of capacity.
  void next();

 private:
  size_t header_bytes_;
  body_fn body_of_;
  size_t chunk_;
  std::vector<uint8_t> buf_;  // [got_]: the frame so far (header, then body)
  size_t got_ = 0;
  size_t body_bytes_ = 0;
  bool header_known_ = false;
};

// A whole frame's time limit: a base for any frame, and more for a long one at a least
// rate, so that a peer cannot hold a connection (and what it holds) by trickling, while a
// large frame on a slow link still gets through.
struct frame_deadline {
  std::chrono::milliseconds base{5000};
  double min_bytes_per_s = 16.0 * 1024 * 1024;
  std::chrono::steady_clock::duration for_bytes(size_t bytes) const {
    return base + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(static_cast<double>(bytes) / min_bytes_per_s));
  }
};

}  // namespace troupe
