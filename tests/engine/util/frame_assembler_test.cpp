// frame_assembler: the same frames whatever pieces the bytes come in, a refused header
// named, and memory that follows the bytes that arrived rather than the length announced.
#include "engine/util/frame_assembler.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/util/tcp.hpp"

namespace troupe {

namespace {

// Frames of this test: "FRAM" u32 length, then that many bytes (at most `most`).
frame_assembler test_frames(size_t most, size_t chunk = frame_assembler::default_chunk) {
  return frame_assembler(
      8,
      [most](std::span<const uint8_t> h) -> expected<size_t> {
        if (std::memcmp(h.data(), "FRAM", 4) != 0) return error{"not a frame"};
        const uint32_t n = tcp::get32(h.data() + 4);
        if (n > most) return error{"a body of " + std::to_string(n) + " bytes"};
        return size_t{n};
      },
      chunk);
}

std::vector<uint8_t> frame_of(const std::string& body) {
  std::vector<uint8_t> f = {'F', 'R', 'A', 'M', 0, 0, 0, 0};
  tcp::put32(f.data() + 4, static_cast<uint32_t>(body.size()));
  f.insert(f.end(), body.begin(), body.end());
  return f;
}

// Feeds `bytes` in pieces of `piece` (the last shorter), reading no more than each
// wanted(); the bodies of the frames made whole, in order.
std::vector<std::string> feed(frame_assembler& f, const std::vector<uint8_t>& bytes, size_t piece) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t n = std::min({piece, f.wanted(), bytes.size() - at});
    REQUIRE(n > 0);
    std::memcpy(f.space(), bytes.data() + at, n);
    REQUIRE(f.took(n).has_value());
    at += n;
    if (f.whole()) {
      out.emplace_back(f.body().begin(), f.body().end());
      f.next();
    }
  }
  return out;
}

}  // namespace

TEST_CASE("frame_assembler: frames come out whole and in order, in any pieces") {
  std::vector<uint8_t> stream;
  const std::vector<std::string> bodies = {"", "a", "hello", std::string(3000, 'x'), "", std::string(70, 'y')};
  for (const auto& b : bodies) {
    const auto f = frame_of(b);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (size_t piece : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{8}, size_t{9}, size_t{100}, size_t{1} << 20}) {
    CAPTURE(piece);
    for (size_t chunk : {size_t{1}, size_t{5}, size_t{64}, frame_assembler::default_chunk}) {
      CAPTURE(chunk);
      auto f = test_frames(4096, chunk);
      CHECK(feed(f, stream, piece) == bodies);
      CHECK_FALSE(f.begun());
    }
  }
}

TEST_CASE("frame_assembler: a header is checked once whole, and its refusal is the reason") {
  auto f = test_frames(100);
  const std::vector<uint8_t> bad = {'N', 'O', 'P', 'E', 1, 0, 0, 0};
  std::memcpy(f.space(), bad.data(), 7);
  REQUIRE(f.took(7).has_value());  // not whole: nothing to check yet
  CHECK(f.begun());
  CHECK(f.wanted() == 1);
  f.space()[0] = bad[7];
  const status s = f.took(1);
  REQUIRE_FALSE(s.has_value());
  CHECK(s.err().message == "not a frame");
  auto g = test_frames(100);
  const auto big = frame_of(std::string(101, 'z'));
  std::memcpy(g.space(), big.data(), 8);
  const status t = g.took(8);
  REQUIRE_FALSE(t.has_value());
  CHECK(t.err().message == "a body of 101 bytes");
}

TEST_CASE("frame_assembler: memory follows the bytes that arrived, not the length announced") {
  const size_t chunk = 4096;
  auto f = test_frames(size_t{1} << 30, chunk);
  std::vector<uint8_t> h = {'F', 'R', 'A', 'M', 0, 0, 0, 0};
  tcp::put32(h.data() + 4, 1u << 30);  // announces 1 GiB
  std::memcpy(f.space(), h.data(), 8);
  REQUIRE(f.took(8).has_value());
  CHECK(f.frame_bytes() == 8 + (size_t{1} << 30));
  CHECK(f.wanted() == chunk);
  // A few bytes trickle in: the buffer holds them and room for one read.
  for (int i = 0; i < 100; ++i) {
    f.space()[0] = 1;
    REQUIRE(f.took(1).has_value());
  }
  CHECK(f.capacity() <= 2 * (8 + 100 + chunk));
  // More arrive: still bounded by what came (vector growth at most doubles).
  size_t got = 108;
  for (int i = 0; i < 64; ++i) {
    const size_t n = f.wanted();
    std::memset(f.space(), 2, n);
    REQUIRE(f.took(n).has_value());
    got += n;
  }
  CHECK(f.capacity() <= 2 * (got + chunk));
  CHECK_FALSE(f.whole());
}

TEST_CASE("frame_deadline: a base for any frame, and more for a long one at the least rate") {
  frame_deadline d;
  d.base = std::chrono::seconds(5);
  d.min_bytes_per_s = 1 << 20;
  CHECK(d.for_bytes(0) == std::chrono::seconds(5));
  CHECK(d.for_bytes(size_t{10} << 20) == std::chrono::seconds(15));
}

}  // namespace troupe
