// Step links and KV channels secured by TLS (actors/tls/tls_links.hpp): they work within a
// cluster, refuse and log strangers, and carry nothing in the clear.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstddef>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "actors/step_link.hpp"
#include "actors/tls/tls_links.hpp"
#include "engine/kv/kv_channel.hpp"
#include "tests/actors/tls_clusters.hpp"
#include "tests/support/byte_relay.hpp"

namespace troupe {

namespace {

using test::byte_relay;
using test::clusters;
using test::stderr_capture;

// Words no frame header holds: found on the wire only where payloads travel in the clear.
const std::string secret = "Once upon a time, a secret prompt";

wire_message text_message(wire_kind kind, const std::string& text) {
  return wire_message(kind, std::vector<uint8_t>(text.begin(), text.end()));
}

std::string text_of(const wire_message& m) { return m.bytes ? std::string(m.bytes->begin(), m.bytes->end()) : ""; }

// The stage: answers plan "x" with activations "y" with "x+y".
expected<wire_message> echo_step(const wire_message& plan, const wire_message& act) {
  return text_message(wire_kind::activations, text_of(plan) + "+" + text_of(act));
}

// Answers and breaks a client reported, waited for with a bound.
struct inbox {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::string> answers;
  std::string broken;

  std::unique_ptr<step_link_client> connect(uint16_t port, std::shared_ptr<const link_guard> guard,
                                            std::string* refused = nullptr) {
    auto c = step_link_client::connect(
        "127.0.0.1", port,
        [this](expected<wire_message> a) {
          std::lock_guard<std::mutex> lock(m);
          answers.push_back(a ? text_of(*a) : "error: " + a.err().message);
          cv.notify_all();
        },
        [this](const std::string& why) {
          std::lock_guard<std::mutex> lock(m);
          broken = why;
          cv.notify_all();
        },
        std::move(guard));
    if (!c) {
      if (refused) *refused = c.err().message;
      return nullptr;
    }
    return std::move(c).value();
  }
  std::string next() {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return !answers.empty(); })) return "timeout";
    std::string a = answers.front();
    answers.pop_front();
    return a;
  }
  bool broke() {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return !broken.empty(); });
  }
};

int raw_connect(uint16_t port) {
  const int fd = test::connect_loopback(port);
  REQUIRE(fd >= 0);
  return fd;
}

// The link guards of the test clusters' nodes: a1 and a2 of cluster a, b1 of cluster b.
struct node_guards {
  std::shared_ptr<const link_guard> a1, a2, b1;
};
node_guards guards(const clusters& c) {
  return {tls::link_guard_of(c.context("a1", "a")), tls::link_guard_of(c.context("a2", "a")),
          tls::link_guard_of(c.context("b1", "b"))};
}

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

}  // namespace

TEST_CASE("tls step links: steps within a cluster, strangers refused and logged, a silent one holds up nothing") {
  std::signal(SIGPIPE, SIG_IGN);
  clusters c;
  const auto [a1, a2, b1] = guards(c);
  stderr_capture log;
  auto server = step_link_server::start("127.0.0.1", echo_step, {}, a1);
  REQUIRE(server.has_value());
  const uint16_t port = (*server)->port();

  // A stranger that connects and says nothing is in its handshake meanwhile.
  const int silent = raw_connect(port);

  inbox ok;
  auto client = ok.connect(port, a2);
  REQUIRE(client);
  REQUIRE(client->send(text_message(wire_kind::step_plan, "plan"), text_message(wire_kind::activations, "act")));
  CHECK(ok.next() == "plan+act");

  SUBCASE("another cluster's node: it does not trust this server") {
    inbox other;
    std::string why;
    CHECK(other.connect(port, b1, &why) == nullptr);
    CHECK(why.find("step link to 127.0.0.1:" + std::to_string(port)) != std::string::npos);
    CHECK(why.find("not of this cluster") != std::string::npos);
    CHECK(log.wait_for("troupe: step link on port " + std::to_string(port) + ": 127.0.0.1:"));
  }
  SUBCASE("plain TCP with valid frames: refused, logged, the client told") {
    inbox plain;
    auto p = plain.connect(port, nullptr);
    REQUIRE(p);  // TCP connects; the first frame is not a TLS handshake
    CHECK(p->send(text_message(wire_kind::step_plan, "plan"), text_message(wire_kind::activations, "act")));
    CHECK(plain.broke());
    CHECK(log.wait_for("refused: it does not speak TLS"));
  }
  SUBCASE("a peer that leaves during its handshake: logged as leaving, not as refused") {
    ::close(raw_connect(port));
    CHECK(log.wait_for(std::string(": ") + closed_in_handshake));
    CHECK(log.text().find(std::string("refused: ") + closed_in_handshake) == std::string::npos);
  }
  SUBCASE("the silent stranger is closed after the handshake deadline, and logged") {
    CHECK(log.wait_for("refused: no TLS handshake within " + std::to_string(link_handshake_ms) + " ms", 10));
  }
  // The cluster's client still steps, after all of it.
  REQUIRE(client->send(text_message(wire_kind::step_plan, "again"), text_message(wire_kind::activations, "act")));
  CHECK(ok.next() == "again+act");
  ::close(silent);
}

TEST_CASE("tls step links: silent connections filling every handshake slot do not keep a cluster's node out") {
  std::signal(SIGPIPE, SIG_IGN);
  clusters c;
  const auto [a1, a2, b1] = guards(c);
  auto meter = std::make_shared<link_meter>();
  auto server = step_link_server::start("127.0.0.1", echo_step, {}, a1, meter);
  REQUIRE(server.has_value());
  const uint16_t port = (*server)->port();
  // Many more silent connections than there are handshake slots, all still open.
  std::vector<int> silent;
  for (int i = 0; i < 80; ++i) silent.push_back(raw_connect(port));
  // A node of the cluster connects and steps, every time.
  for (int round = 0; round < 5; ++round) {
    inbox ok;
    std::string why;
    auto client = ok.connect(port, a2, &why);
    CAPTURE(why);
    REQUIRE(client);
    REQUIRE(client->send(text_message(wire_kind::step_plan, "p" + std::to_string(round)), wire_message{}));
    CHECK(ok.next() == "p" + std::to_string(round) + "+");
    silent.push_back(raw_connect(port));
  }
  CHECK(meter->counts(link_kind::step).crowded >= 40);
  for (int fd : silent) ::close(fd);
}

TEST_CASE("tls kv channels: records within a cluster, strangers refused and logged") {
  std::signal(SIGPIPE, SIG_IGN);
  clusters c;
  const auto [a1, a2, b1] = guards(c);
  stderr_capture log;
  std::mutex m;
  std::vector<std::string> landed;
  auto r = kv_channel_receiver::start(
      "127.0.0.1", 0,
      [&](std::string_view name, std::span<const std::byte> payload) {
        std::lock_guard<std::mutex> lock(m);
        landed.push_back(std::string(name) + "=" + std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
      },
      {}, {}, a1);
  REQUIRE(r.has_value());
  const uint16_t port = (*r)->port();

  auto s = kv_channel_sender::connect("127.0.0.1", port, {}, a2);
  REQUIRE(s.has_value());
  REQUIRE((*s)->send("block-1", bytes_of(secret)));
  CHECK((*s)->flush(std::chrono::seconds(10)));
  {
    std::lock_guard<std::mutex> lock(m);
    REQUIRE(landed.size() == 1);
    CHECK(landed[0] == "block-1=" + secret);
  }

  auto other = kv_channel_sender::connect("127.0.0.1", port, {}, b1);
  REQUIRE(!other);
  CHECK(other.err().message.find("not of this cluster") != std::string::npos);

  auto plain = kv_channel_sender::connect("127.0.0.1", port, {}, nullptr);
  if (plain) {  // TCP connects and the hello goes out; the receiver refuses it
    const bool landed_too = (*plain)->send("block-2", bytes_of(secret)) && (*plain)->flush(std::chrono::seconds(10));
    CHECK_FALSE(landed_too);
  }
  // Both strangers are refused on the receiver's side, each on its own thread and in
  // either order: the count is read once both are logged.
  CHECK(log.wait_for_count("troupe: kv channel on port " + std::to_string(port) + ": 127.0.0.1:", 2));
  CHECK(log.wait_for("refused: it does not speak TLS"));
  CHECK((*r)->stats().refused >= 2);
  std::lock_guard<std::mutex> lock(m);
  CHECK(landed.size() == 1);
}

TEST_CASE("secured step links and kv channels carry no plaintext: bytes recorded on the wire") {
  std::signal(SIGPIPE, SIG_IGN);
  clusters c;
  const auto [a1, a2, b1] = guards(c);
  for (const bool secured : {false, true}) {
    CAPTURE(secured);
    const auto server_guard = secured ? a1 : nullptr, client_guard = secured ? a2 : nullptr;

    auto server = step_link_server::start("127.0.0.1", echo_step, {}, server_guard);
    REQUIRE(server.has_value());
    byte_relay step_wire((*server)->port());
    inbox in;
    auto client = in.connect(step_wire.port(), client_guard);
    REQUIRE(client);
    REQUIRE(client->send(text_message(wire_kind::step_plan, secret), text_message(wire_kind::activations, "act")));
    CHECK(in.next() == secret + "+act");

    auto r = kv_channel_receiver::start("127.0.0.1", 0, [](std::string_view, std::span<const std::byte>) {}, {}, {},
                                        server_guard);
    REQUIRE(r.has_value());
    byte_relay kv_wire((*r)->port());
    auto s = kv_channel_sender::connect("127.0.0.1", kv_wire.port(), {}, client_guard);
    REQUIRE(s.has_value());
    REQUIRE((*s)->send("block", bytes_of(secret)));
    CHECK((*s)->flush(std::chrono::seconds(10)));

    // In the clear, the recording holds the payloads and the frames' magic; secured, neither.
    CHECK(step_wire.saw(secret) == !secured);
    CHECK(step_wire.saw("TRSL") == !secured);
    CHECK(kv_wire.saw(secret) == !secured);
    CHECK(kv_wire.saw("TKVB") == !secured);
    CHECK(kv_wire.saw("TKVH") == !secured);
    CHECK(step_wire.bytes().size() > secret.size());
  }
}

}  // namespace troupe
