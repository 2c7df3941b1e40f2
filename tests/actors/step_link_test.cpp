#include "actors/step_link.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <future>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "tests/support/byte_relay.hpp"

namespace troupe {

namespace {

wire_message bytes_message(wire_kind kind, const std::string& text) {
  return wire_message(kind, std::vector<uint8_t>(text.begin(), text.end()));
}

std::string text_of(const wire_message& m) { return m.bytes ? std::string(m.bytes->begin(), m.bytes->end()) : ""; }

// The test's stage: answers a plan "x" (with activations "y") with activations "x+y", a
// plan that starts with '!' with an error, and throws on one that starts with '#'.
expected<wire_message> echo_step(const wire_message& plan, const wire_message& act) {
  const std::string p = text_of(plan);
  if (!p.empty() && p[0] == '!') return error{"refused " + p};
  if (!p.empty() && p[0] == '#') throw std::runtime_error("thrown by " + p);
  return bytes_message(wire_kind::activations, p + "+" + text_of(act));
}

// What a client's thread delivered, waited for with a bound.
struct inbox {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::string> answers;  // "ok:<text>" or "error:<text>"
  std::vector<std::string> broken;

  void answer(expected<wire_message> a) {
    std::lock_guard<std::mutex> lock(m);
    answers.push_back(a ? "ok:" + text_of(*a) : "error:" + a.err().message);
    cv.notify_all();
  }
  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(m);
    broken.push_back(why);
    cv.notify_all();
  }
  std::string next() {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, std::chrono::seconds(5), [&] { return !answers.empty(); })) return "timeout";
    std::string a = answers.front();
    answers.pop_front();
    return a;
  }
  size_t broken_count(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait_for(lock, wait, [&] { return !broken.empty(); });
    return broken.size();
  }
};

std::unique_ptr<step_link_client> connect_to(const step_link_server& s, inbox& in) {
  auto c = step_link_client::connect(
      "127.0.0.1", s.port(), [&in](expected<wire_message> a) { in.answer(std::move(a)); },
      [&in](const std::string& why) { in.fail(why); });
  REQUIRE(c.has_value());
  return std::move(c).value();
}

// A plain socket to the server, for frames no client would send.
int raw_connect(uint16_t port) {
  const int fd = test::connect_loopback(port);
  REQUIRE(fd >= 0);
  return fd;
}

// True when the server closes the connection within a few seconds (a reset counts: the
// server closed with bytes of ours unread).
bool closed_by_server(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 5000) != 1) return false;
  char b;
  const ssize_t r = ::recv(fd, &b, 1, 0);
  return r == 0 || (r < 0 && errno == ECONNRESET);
}

std::vector<uint8_t> header(uint32_t magic, uint32_t plan_kind, uint32_t plan_len, uint32_t act_kind,
                            uint32_t act_len) {
  std::vector<uint8_t> h(20);
  const uint32_t v[] = {magic, plan_kind, plan_len, act_kind, act_len};
  for (int i = 0; i < 5; ++i)
    for (int b = 0; b < 4; ++b) h[i * 4 + b] = static_cast<uint8_t>(v[i] >> (8 * b));
  return h;
}

constexpr uint32_t magic = 0x4c535254;  // "TRSL"

}  // namespace

TEST_CASE("a step link carries steps and their answers in order, and a failed step as an error") {
  auto server = step_link_server::start("127.0.0.1", echo_step);
  REQUIRE(server.has_value());
  inbox in;
  auto client = connect_to(**server, in);
  REQUIRE(client->send(bytes_message(wire_kind::step_plan, "a"), wire_message{}).has_value());
  REQUIRE(client->send(bytes_message(wire_kind::step_plan, "!b"), wire_message{}).has_value());
  REQUIRE(client->send(bytes_message(wire_kind::step_plan, "#t"), wire_message{}).has_value());
  REQUIRE(client->send(bytes_message(wire_kind::step_plan, "c"), bytes_message(wire_kind::activations, "h")).has_value());
  CHECK(in.next() == "ok:a+");
  CHECK(in.next() == "error:refused !b");
  CHECK(in.next() == "error:the step failed: thrown by #t");
  CHECK(in.next() == "ok:c+h");
  // A large step arrives whole.
  const std::string big(3 << 20, 'x');
  REQUIRE(client->send(bytes_message(wire_kind::step_plan, big), wire_message{}).has_value());
  CHECK(in.next() == "ok:" + big + "+");
  client.reset();
  CHECK(in.broken_count(std::chrono::milliseconds(100)) == 0);  // closing is not breaking
}

TEST_CASE("large steps sent to a busy stage queue behind each other and arrive whole, in order") {
  // The stage holds its first step until every send has returned, so the socket fills and
  // the client's writer thread takes over: a send that waited for the stage would never
  // return, and the test would end at its time limit.
  std::promise<void> all_sent;
  std::shared_future<void> sent = all_sent.get_future().share();
  auto server = step_link_server::start("127.0.0.1", [sent](const wire_message& plan, const wire_message& act) {
    sent.wait();
    const std::string p = text_of(plan);
    return expected<wire_message>(bytes_message(wire_kind::activations, p.substr(0, 1) + std::to_string(p.size()) +
                                                                            "+" + std::to_string(act.size())));
  });
  REQUIRE(server.has_value());
  inbox in;
  auto client = connect_to(**server, in);
  struct release_stage {  // however the test ends, before the server waits for its step
    std::promise<void>& p;
    bool released = false;
    ~release_stage() {
      if (!released) p.set_value();
    }
  } release{all_sent};
  const size_t big = size_t{6} << 20;
  for (char c : std::string("abcdef"))
    REQUIRE(client->send(bytes_message(wire_kind::step_plan, std::string(big, c)),
                         bytes_message(wire_kind::activations, std::string(1000 + c, 'h')))
                .has_value());
  all_sent.set_value();
  release.released = true;
  for (char c : std::string("abcdef"))
    CHECK(in.next() == "ok:" + std::string(1, c) + std::to_string(big) + "+" + std::to_string(1000 + c));
}

TEST_CASE("a step link server drops a connection that breaks the frame rules and serves the next") {
  auto server = step_link_server::start("127.0.0.1", echo_step);
  REQUIRE(server.has_value());
  const uint16_t port = (*server)->port();
  const uint32_t too_long = static_cast<uint32_t>(wire_message::max_frame_bytes) + 1;
  const std::vector<std::vector<uint8_t>> bad = {
      header(0x12345678, 1, 0, 0, 0),   // not the magic
      header(magic, 999, 0, 0, 0),      // no such kind
      header(magic, 1, 0, 999, 0),      // no such kind for the activations
      header(magic, 1, too_long, 0, 0), // a plan over the frame limit
      header(magic, 1, 0, 3, too_long), // activations over it
  };
  for (const auto& frame : bad) {
    const int fd = raw_connect(port);
    REQUIRE(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
    CHECK(closed_by_server(fd));
    ::close(fd);
  }
  {  // A frame cut short, then the connection closed.
    const int fd = raw_connect(port);
    auto frame = header(magic, 1, 100, 0, 0);
    frame.resize(frame.size() + 10, 'p');
    REQUIRE(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
    ::close(fd);
  }
  inbox in;
  auto client = connect_to(**server, in);
  REQUIRE(client->send(bytes_message(wire_kind::step_plan, "still"), wire_message{}).has_value());
  CHECK(in.next() == "ok:still+");
  // Sixteen idle connections more (a stranger's): they push out each other, never the
  // client's, which has stepped.
  std::vector<int> idle;
  for (int i = 0; i < 16; ++i) idle.push_back(raw_connect(port));
  REQUIRE(client->send(bytes_message(wire_kind::step_plan, "among idle"), wire_message{}).has_value());
  CHECK(in.next() == "ok:among idle+");
  CHECK(in.broken_count(std::chrono::milliseconds(200)) == 0);
  for (int fd : idle) ::close(fd);
  // Eight clients more that step: the oldest of them all, the first, is closed.
  std::vector<std::unique_ptr<inbox>> inboxes;
  std::vector<std::unique_ptr<step_link_client>> more;
  for (int i = 0; i < 8; ++i) {
    inboxes.push_back(std::make_unique<inbox>());
    more.push_back(connect_to(**server, *inboxes.back()));
    REQUIRE(more.back()->send(bytes_message(wire_kind::step_plan, "m"), wire_message{}).has_value());
    CHECK(inboxes.back()->next() == "ok:m+");
  }
  CHECK(in.broken_count(std::chrono::seconds(5)) == 1);
}

TEST_CASE("a step frame trickled byte by byte holds up no other connection's steps, and is cut off at its deadline") {
  auto meter = std::make_shared<link_meter>();
  frame_deadline limit;
  limit.base = std::chrono::milliseconds(800);
  auto server = step_link_server::start("127.0.0.1", echo_step, {}, nullptr, meter, limit);
  REQUIRE(server.has_value());
  // A header announcing a 4,096-byte plan, then a byte at a time: every read comes well
  // within any per-read timeout, the frame as a whole never.
  const int trickle = raw_connect((*server)->port());
  const auto h = header(magic, static_cast<uint32_t>(wire_kind::step_plan), 4096, 0, 0);
  REQUIRE(::send(trickle, h.data(), h.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(h.size()));
  inbox in;
  auto client = connect_to(**server, in);
  bool cut = false;
  int answered_while_trickling = 0;
  for (int i = 0; i < 500 && !cut; ++i) {
    const char b = 'p';
    if (::send(trickle, &b, 1, MSG_NOSIGNAL) != 1 || meter->counts(link_kind::step).stalled == 1) {
      cut = true;
      break;
    }
    if (i % 5 == 0) {
      // The scheduler's steps go on beside it, each answered before the trickle ends.
      REQUIRE(client->send(bytes_message(wire_kind::step_plan, "s" + std::to_string(i)), wire_message{}).has_value());
      CHECK(in.next() == "ok:s" + std::to_string(i) + "+");
      answered_while_trickling += meter->counts(link_kind::step).stalled == 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the trickler's pace
  }
  CHECK(answered_while_trickling >= 3);
  CHECK(closed_by_server(trickle));
  ::close(trickle);
  CHECK(meter->counts(link_kind::step).stalled == 1);
  CHECK(meter->counts(link_kind::step).last_stall_ms > 0);
  // The trickler's connection is gone; the scheduler's is not.
  REQUIRE(client->send(bytes_message(wire_kind::step_plan, "after"), wire_message{}).has_value());
  CHECK(in.next() == "ok:after+");
  CHECK(in.broken_count(std::chrono::milliseconds(50)) == 0);
}

TEST_CASE("a client hears once that its link broke when the server goes, and connections are served side by side") {
  auto server = step_link_server::start("127.0.0.1", echo_step);
  REQUIRE(server.has_value());
  inbox first, second;
  auto a = connect_to(**server, first);
  REQUIRE(a->send(bytes_message(wire_kind::step_plan, "1"), wire_message{}).has_value());
  CHECK(first.next() == "ok:1+");
  auto b = connect_to(**server, second);  // as a scheduler does after a loss
  REQUIRE(b->send(bytes_message(wire_kind::step_plan, "2"), wire_message{}).has_value());
  CHECK(second.next() == "ok:2+");
  REQUIRE(a->send(bytes_message(wire_kind::step_plan, "3"), wire_message{}).has_value());
  CHECK(first.next() == "ok:3+");
  a.reset();
  CHECK(first.broken_count(std::chrono::milliseconds(100)) == 0);
  server = error{"gone"};  // the stage's process ends
  CHECK(second.broken_count(std::chrono::seconds(5)) == 1);
  // Once it has heard, a send is refused at once, with the reason.
  auto late = b->send(bytes_message(wire_kind::step_plan, "late"), wire_message{});
  REQUIRE_FALSE(late.has_value());
  CHECK(late.err().message == "step link: the stage closed the step link");
  CHECK(second.broken_count(std::chrono::milliseconds(100)) == 1);
}

TEST_CASE("a step link client reports a server that is not there") {
  uint16_t port = 0;
  {
    auto server = step_link_server::start("127.0.0.1", echo_step);
    REQUIRE(server.has_value());
    port = (*server)->port();
  }  // closed: nothing listens there now
  auto c = step_link_client::connect("127.0.0.1", port, [](expected<wire_message>) {}, [](const std::string&) {});
  REQUIRE_FALSE(c.has_value());
  CHECK(c.err().message.find("step link") != std::string::npos);
  auto bad_host = step_link_server::start("no-such-host.invalid", echo_step);
  CHECK_FALSE(bad_host.has_value());
}

TEST_CASE("a step link takes the first free port of the range it is given, and names the range when all are taken") {
  // Two neighbouring ports nothing listens on.
  uint16_t first = 0;
  for (uint16_t p = 31000; p < 33000 && first == 0; p += 2) {
    auto a = tcp::listen_on("127.0.0.1", p, "probe"), b = tcp::listen_on("127.0.0.1", static_cast<uint16_t>(p + 1), "probe");
    if (a && b) first = p;
    for (auto* l : {&a, &b})
      if (*l) ::close((*l)->fd);
  }
  REQUIRE(first != 0);
  const tcp::port_range range{first, static_cast<uint16_t>(first + 1)};
  auto one = step_link_server::start("127.0.0.1", echo_step, range);
  REQUIRE(one.has_value());
  CHECK((*one)->port() == first);
  auto two = step_link_server::start("127.0.0.1", echo_step, range);
  REQUIRE(two.has_value());
  CHECK((*two)->port() == first + 1);
  auto three = step_link_server::start("127.0.0.1", echo_step, range);
  REQUIRE_FALSE(three.has_value());
  CHECK(three.err().message == "step link: every port of " + range.str() + " on 127.0.0.1 is in use");
  // Any other failure is not taken for a busy port.
  auto bad_host = step_link_server::start("no-such-host.invalid", echo_step, range);
  REQUIRE_FALSE(bad_host.has_value());
  CHECK(bad_host.err().message.find("in use") == std::string::npos);
}

}  // namespace troupe
