// The KV channel on loopback: records arrive whole and checked, a slow receiver holds its
// sender back within the window and queue, and a peer that breaks the format, sends a
// corrupt record or says nothing is refused with a reason while the channel's other
// connections go on.
#include "engine/kv/kv_channel.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "engine/kv/kv_tiers.hpp"
#include "engine/util/tcp.hpp"
#include "tests/support/eventually.hpp"

namespace troupe {

namespace {

std::vector<std::byte> bytes_of(size_t n, uint8_t seed) {
  std::vector<std::byte> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = std::byte(static_cast<uint8_t>(seed + i * 7));
  return b;
}

// What a receiver got, by name.
struct collected {
  std::mutex m;
  std::condition_variable cv;
  std::map<std::string, std::vector<std::byte>> got;
  std::vector<std::string> logs;
  void take(std::string_view name, std::span<const std::byte> p) {
    std::lock_guard<std::mutex> lock(m);
    got[std::string(name)].assign(p.begin(), p.end());
    cv.notify_all();
  }
  bool wait_for(size_t n) {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return got.size() >= n; });
  }
};

std::unique_ptr<kv_channel_receiver> receiver(collected& c, kv_channel_limits lim = {}) {
  auto r = kv_channel_receiver::start(
      "127.0.0.1", 0, [&c](std::string_view n, std::span<const std::byte> p) { c.take(n, p); }, lim,
      [&c](const std::string& line) {
        std::lock_guard<std::mutex> lock(c.m);
        c.logs.push_back(line);
        c.cv.notify_all();
      });
  REQUIRE(r.has_value());
  return std::move(r).value();
}

// A raw connection to the receiver, for frames no sender would send.
int raw(uint16_t port) {
  auto fd = tcp::connect_to("127.0.0.1", port, 2000, "test");
  REQUIRE(fd.has_value());
  return *fd;
}

bool wait_refused(const kv_channel_receiver& r, uint64_t n) {
  return test::eventually([&] { return r.stats().refused >= n; });
}

bool wait_late(const kv_channel_receiver& r, uint64_t n) {
  return test::eventually([&] { return r.stats().late >= n; });
}

// Whether the peer closed fd (a read sees the end within `within`).
bool closed_by_peer(int fd, std::chrono::milliseconds within) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(within.count())) <= 0) return false;
  char b[64];
  return ::recv(fd, b, sizeof b, MSG_DONTWAIT) <= 0;
}

}  // namespace

TEST_CASE("kv channel: records of every size arrive whole, in any number, and the sender knows when they landed") {
  collected c;
  auto r = receiver(c);
  auto s = kv_channel_sender::connect("127.0.0.1", r->port());
  REQUIRE(s.has_value());
  size_t total = 0;
  for (int i = 0; i < 200; ++i) {
    const size_t n = static_cast<size_t>(i) * i * 17 % 200000;  // 0 .. 200 KB
    total += n;
    REQUIRE((*s)->send("block-" + std::to_string(i), bytes_of(n, static_cast<uint8_t>(i))).has_value());
  }
  CHECK((*s)->flush(std::chrono::seconds(20)));
  REQUIRE(c.wait_for(200));
  for (int i = 0; i < 200; ++i) {
    const size_t n = static_cast<size_t>(i) * i * 17 % 200000;
    CHECK(c.got["block-" + std::to_string(i)] == bytes_of(n, static_cast<uint8_t>(i)));
  }
  CHECK((*s)->stats().records == 200);
  CHECK(r->stats().records == 200);
  CHECK(r->stats().bytes == (*s)->stats().bytes);
  CHECK(r->stats().bytes > total);  // with each record's header and name
  CHECK(r->stats().corrupt == 0);
  CHECK((*s)->broken().empty());
}

TEST_CASE("kv channel: a receiver that does not take records holds its sender within the window") {
  std::mutex gate;
  std::condition_variable opened;
  bool open = false;
  std::atomic<int> taken{0};
  auto r = kv_channel_receiver::start("127.0.0.1", 0, [&](std::string_view, std::span<const std::byte>) {
    std::unique_lock<std::mutex> lock(gate);
    opened.wait(lock, [&] { return open; });
    ++taken;
  });
  REQUIRE(r.has_value());
  kv_channel_limits lim;
  lim.window = 8 << 10;
  auto s = kv_channel_sender::connect("127.0.0.1", (*r)->port(), lim);
  REQUIRE(s.has_value());
  std::atomic<int> queued{0};
  std::string failed;
  std::thread producer([&] {
    for (int i = 0; i < 100 && failed.empty(); ++i) {
      auto sent = (*s)->send("b" + std::to_string(i), bytes_of(4000, 1));
      if (!sent) failed = sent.err().message;
      ++queued;
    }
  });
  // With the first record stuck in the sink (unacknowledged) the producer stops at the
  // window, having sent no more than it holds: two records of 4 KB.
  REQUIRE(test::eventually([&] { return (*s)->stats().stalls >= 1; }));
  CHECK(queued.load() <= 2);
  CHECK_FALSE((*s)->flush(std::chrono::milliseconds(10)));
  {
    std::lock_guard<std::mutex> lock(gate);
    open = true;
  }
  opened.notify_all();
  producer.join();
  CHECK(failed == "");
  CHECK((*s)->flush(std::chrono::seconds(20)));
  CHECK(taken.load() == 100);
  CHECK((*s)->stats().stalls > 0);
}

TEST_CASE("kv channel: broken frames, an oversized record and a silent peer are refused with a reason, and a corrupt record is dropped") {
  collected c;
  kv_channel_limits lim;
  lim.max_record = 1 << 16;
  lim.frame_time.base = std::chrono::seconds(1);
  auto r = receiver(c, lim);
  const uint8_t hello[8] = {'T', 'K', 'V', 'H', 1, 0, 0, 0};
  // Not a sender at all.
  {
    const int fd = raw(r->port());
    CHECK(tcp::write_all(fd, {{"GET / HTTP/1.1\r\n\r\n", 18}}));
    CHECK(wait_refused(*r, 1));
    ::close(fd);
  }
  // A record longer than the limit: refused from its header, before any of it is read.
  {
    const int fd = raw(r->port());
    uint8_t h[8] = {'T', 'K', 'V', 'B'};
    tcp::put32(h + 4, (1 << 16) + 1);
    CHECK(tcp::write_all(fd, {{hello, 8}, {h, 8}}));
    CHECK(wait_refused(*r, 2));
    ::close(fd);
  }
  // Silent after connecting: no hello within the frame's deadline (a stall, counted apart).
  {
    const int fd = raw(r->port());
    CHECK(wait_late(*r, 1));
    ::close(fd);
  }
  // A record with a flipped byte: dropped and counted; the next one on the same
  // connection still lands.
  {
    const int fd = raw(r->port());
    auto bad = seal_record("bad", bytes_of(100, 3));
    bad.back() ^= std::byte{1};
    const auto good = seal_record("good", bytes_of(100, 4));
    uint8_t hb[8] = {'T', 'K', 'V', 'B'}, hg[8] = {'T', 'K', 'V', 'B'};
    tcp::put32(hb + 4, static_cast<uint32_t>(bad.size()));
    tcp::put32(hg + 4, static_cast<uint32_t>(good.size()));
    CHECK(tcp::write_all(fd, {{hello, 8}, {hb, 8}, {bad.data(), bad.size()}}));
    CHECK(tcp::write_all(fd, {{hg, 8}, {good.data(), good.size()}}));
    REQUIRE(c.wait_for(1));
    CHECK(c.got.count("good") == 1);
    CHECK(c.got.count("bad") == 0);
    CHECK(r->stats().corrupt == 1);
    ::close(fd);
  }
  CHECK(r->stats().refused == 2);
  CHECK(r->stats().late == 1);
  std::lock_guard<std::mutex> lock(c.m);
  std::string all;
  for (auto& l : c.logs) all += l + "\n";
  CAPTURE(all);
  CHECK(all.find("a frame that is not a block") == std::string::npos);
  CHECK(all.find("a peer that is not a kv channel sender") != std::string::npos);
  CHECK(all.find("a record of 65537 bytes (at most 65536)") != std::string::npos);
  CHECK(all.find("a hello not whole by its deadline (a stalled link)") != std::string::npos);
  CHECK(all.find("failing its checksum") != std::string::npos);
}

TEST_CASE("kv channel: a receiver that goes away breaks its sender with a reason, and nothing waits forever") {
  collected c;
  auto r = receiver(c);
  auto s = kv_channel_sender::connect("127.0.0.1", r->port());
  REQUIRE(s.has_value());
  REQUIRE((*s)->send("a", bytes_of(10, 1)).has_value());
  CHECK((*s)->flush(std::chrono::seconds(20)));
  r.reset();
  REQUIRE(test::eventually([&] { return !(*s)->broken().empty(); }));
  CHECK((*s)->broken() == "the receiver closed the channel");
  auto after = (*s)->send("b", bytes_of(10, 1));
  REQUIRE_FALSE(after.has_value());
  CHECK(after.err().message == "kv channel: the receiver closed the channel");
  CHECK_FALSE((*s)->flush(std::chrono::seconds(1)));
  // Nothing listens there now.
  CHECK_FALSE(kv_channel_sender::connect("127.0.0.1", 1).has_value());
  // A record past the limit is refused before it is queued.
  collected d;
  auto r2 = receiver(d);
  kv_channel_limits lim;
  lim.max_record = 100;
  auto s2 = kv_channel_sender::connect("127.0.0.1", r2->port(), lim);
  REQUIRE(s2.has_value());
  CHECK_FALSE((*s2)->send("big", bytes_of(200, 1)).has_value());
}

TEST_CASE("kv channel: past its connections, a receiver closes the oldest for a newcomer") {
  collected c;
  kv_channel_limits lim;
  lim.max_connections = 1;
  auto r = receiver(c, lim);
  auto a = kv_channel_sender::connect("127.0.0.1", r->port());
  REQUIRE(a.has_value());
  REQUIRE((*a)->send("a", bytes_of(10, 1)).has_value());
  CHECK((*a)->flush(std::chrono::seconds(20)));
  auto b = kv_channel_sender::connect("127.0.0.1", r->port());
  REQUIRE(b.has_value());
  REQUIRE((*b)->send("b", bytes_of(10, 2)).has_value());
  CHECK((*b)->flush(std::chrono::seconds(20)));
  REQUIRE(test::eventually([&] { return !(*a)->broken().empty(); }));
  CHECK((*a)->broken() == "the receiver closed the channel");
  REQUIRE(c.wait_for(2));
  CHECK(c.got["b"] == bytes_of(10, 2));
}

TEST_CASE("kv channel: a record trickled byte by byte is cut off at its deadline, holding memory only for what came") {
  collected c;
  kv_channel_limits lim;
  lim.frame_time.base = std::chrono::milliseconds(600);
  auto r = receiver(c, lim);
  const uint8_t hello[8] = {'T', 'K', 'V', 'H', 1, 0, 0, 0};
  // A header announcing 60 MiB, then a byte at a time: each read arrives well within any
  // per-read timeout, the frame as a whole never.
  const int fd = raw(r->port());
  uint8_t h[8] = {'T', 'K', 'V', 'B'};
  tcp::put32(h + 4, 60u << 20);
  REQUIRE(tcp::write_all(fd, {{hello, 8}, {h, 8}}));
  // A sender beside it is served meanwhile.
  auto s = kv_channel_sender::connect("127.0.0.1", r->port());
  REQUIRE(s.has_value());
  bool cut = false;
  for (int i = 0; i < 400 && !cut; ++i) {
    const uint8_t b = 7;
    cut = ::send(fd, &b, 1, MSG_NOSIGNAL) != 1 || r->stats().late == 1;
    if (i == 3) {
      REQUIRE((*s)->send("beside", bytes_of(1000, 9)).has_value());
      CHECK((*s)->flush(std::chrono::seconds(20)));
      CHECK(r->stats().late == 0);  // landed while the trickle went on, not behind it
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the trickler's pace
  }
  CHECK(wait_late(*r, 1));  // the 60 MiB frame's deadline is 600 ms + 60 MiB / 16 MiB/s
  CHECK(closed_by_peer(fd, std::chrono::seconds(5)));
  ::close(fd);
  CHECK(c.got.count("beside") == 1);
  std::lock_guard<std::mutex> lock(c.m);
  std::string all;
  for (auto& l : c.logs) all += l + "\n";
  CHECK(all.find("a block of 62914568 bytes not whole by its deadline (a stalled link)") != std::string::npos);
}

TEST_CASE("kv channel: a flood of silent connections never pushes out a sender that said hello") {
  collected c;
  kv_channel_limits lim;
  lim.max_connections = 2;
  lim.max_pending = 4;
  auto r = receiver(c, lim);
  auto a = kv_channel_sender::connect("127.0.0.1", r->port());
  REQUIRE(a.has_value());
  REQUIRE((*a)->send("a", bytes_of(10, 1)).has_value());
  REQUIRE((*a)->flush(std::chrono::seconds(20)));
  // Many more silent connections than either limit.
  std::vector<int> silent;
  for (int i = 0; i < 24; ++i) silent.push_back(raw(r->port()));
  // A newcomer still gets in (it pushes out the oldest silent one), and the first sender
  // still sends.
  auto b = kv_channel_sender::connect("127.0.0.1", r->port());
  REQUIRE(b.has_value());
  REQUIRE((*b)->send("b", bytes_of(10, 2)).has_value());
  CHECK((*b)->flush(std::chrono::seconds(20)));
  REQUIRE((*a)->send("a2", bytes_of(10, 3)).has_value());
  CHECK((*a)->flush(std::chrono::seconds(20)));
  CHECK((*a)->broken().empty());
  CHECK(r->stats().crowded >= 20);
  // The silent ones were cut short, all but the newest max_pending.
  int open = 0;
  for (int fd : silent) open += !closed_by_peer(fd, std::chrono::milliseconds(50));
  CHECK(open <= 4);
  for (int fd : silent) ::close(fd);
  REQUIRE(c.wait_for(3));
}

}  // namespace troupe
