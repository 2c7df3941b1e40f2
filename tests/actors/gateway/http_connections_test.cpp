#include "actors/gateway/http_connections.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// Jobs that wait on one gate, counting how many have started.
struct gate {
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  bool open = false;

  void enter() {
    std::unique_lock<std::mutex> lock(mu);
    ++started;
    cv.notify_all();
    cv.wait_for(lock, 10s, [&] { return open; });
  }
  bool wait_started(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 10s, [&] { return started >= n; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

// A listening socket on 127.0.0.1 and an ephemeral port.
struct listener {
  int fd = -1;
  uint16_t port = 0;
  listener() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(listen(fd, 16) == 0);
    socklen_t n = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    port = ntohs(a.sin_port);
  }
  ~listener() { close(fd); }
};

// Both ends of one connection to a listener; the client's port names it to the watch.
struct connection {
  int client = -1, server = -1;
  int client_port = 0;
  explicit connection(const listener& l) {
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(l.port);
    REQUIRE(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    server = accept4(l.fd, nullptr, nullptr, SOCK_CLOEXEC);
    REQUIRE(server >= 0);
    socklen_t n = sizeof a;
    getsockname(client, reinterpret_cast<sockaddr*>(&a), &n);
    client_port = ntohs(a.sin_port);
    const std::string half = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
    REQUIRE(send(client, half.data(), half.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(half.size()));
  }
  ~connection() {
    close(client);
    close(server);
  }
  // What the client has been sent, until the server's end is shut down (at most 5 s).
  std::string client_reads() const {
    timeval tv{5, 0};
    setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string got;
    char buf[512];
    for (ssize_t n; (n = recv(client, buf, sizeof buf, 0)) > 0;) got.append(buf, static_cast<size_t>(n));
    return got;
  }
  // Whether the server's end has been shut down: reading it comes to an end (after what
  // the client sent) instead of waiting for more.
  bool server_shut() const {
    char buf[512];
    ssize_t n;
    while ((n = recv(server, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
    }
    return n == 0;
  }
};

}  // namespace

TEST_CASE("connection threads: as many connections at once as the cap allows, each on a thread of its own") {
  constexpr int jobs = 64;
  connection_threads pool(jobs);
  gate g;
  for (int i = 0; i < jobs; ++i) pool.enqueue([&] { g.enter(); });
  // Every job waits for the gate: all of them start only if each has a thread.
  CHECK(g.wait_started(jobs));
  CHECK(pool.threads() == jobs);
  g.release();
  pool.shutdown();
  CHECK(g.started == jobs);
}

TEST_CASE("connection threads: past the cap a connection waits for a thread while room is asked for, and none is lost") {
  std::mutex asked_mu;
  std::condition_variable asked_cv;
  int asked = 0;
  connection_threads pool(3, [&] {
    std::lock_guard<std::mutex> lock(asked_mu);
    ++asked;
    asked_cv.notify_all();
  });
  gate g;
  std::atomic<int> done{0};
  for (int i = 0; i < 3; ++i)
    pool.enqueue([&] {
      g.enter();
      ++done;
    });
  REQUIRE(g.wait_started(3));
  {
    std::lock_guard<std::mutex> lock(asked_mu);
    CHECK(asked == 0);
  }
  // A fourth waits in enqueue (as the listening thread would) and asks for room.
  std::atomic<bool> queued{false};
  std::thread listener([&] {
    pool.enqueue([&] { ++done; });
    queued = true;
  });
  {
    std::unique_lock<std::mutex> lock(asked_mu);
    CHECK(asked_cv.wait_for(lock, 10s, [&] { return asked >= 1; }));
  }
  CHECK_FALSE(queued);  // every thread is busy until the gate opens
  CHECK(pool.threads() == 3);
  g.release();
  listener.join();
  pool.shutdown();
  CHECK(done == 4);
}

TEST_CASE("connection threads: idle threads end, down to the number kept") {
  connection_threads pool(16, {}, 20ms, 2);
  gate g;
  for (int i = 0; i < 8; ++i) pool.enqueue([&] { g.enter(); });
  REQUIRE(g.wait_started(8));
  CHECK(pool.threads() == 8);
  g.release();
  CHECK(pool.wait_threads_at_most(2, 10s));
  CHECK(pool.threads() == 2);
  // The threads left still serve.
  std::atomic<bool> ran{false};
  pool.enqueue([&] { ran = true; });
  pool.shutdown();
  CHECK(ran);
}

TEST_CASE("connection threads: released, enqueue queues past the cap, and shutdown runs what is queued first") {
  connection_threads pool(1);
  gate g;
  std::atomic<int> after{0};
  pool.enqueue([&] { g.enter(); });
  pool.release();
  for (int i = 0; i < 4; ++i) pool.enqueue([&] { ++after; });
  REQUIRE(g.wait_started(1));
  std::thread stopper([&] { pool.shutdown(); });
  g.release();
  stopper.join();
  CHECK(after == 4);
}

TEST_CASE("connection watch: a request that has not arrived by the deadline gets 408 and its connection is shut") {
  listener l;
  connection slow(l);
  connection_watch watch(l.port, 100ms);
  const auto t0 = connection_watch::clock::now();
  CHECK(watch.sweep(t0) == 0);  // first seen now
  CHECK(watch.sweep(t0 + 50ms) == 0);
  CHECK_FALSE(slow.server_shut());
  CHECK(watch.sweep(t0 + 150ms) == 1);
  CHECK(watch.timed_out() == 1);
  CHECK(slow.server_shut());
  const std::string got = slow.client_reads();
  CHECK(got.rfind("HTTP/1.1 408 Request Timeout\r\n", 0) == 0);
  CHECK(got.find("\"code\":\"timeout\"") != std::string::npos);
  // Counted once, however often it is looked at before its thread closes it.
  CHECK(watch.sweep(t0 + 300ms) == 0);
  CHECK(watch.timed_out() == 1);
}

TEST_CASE("connection watch: a request that arrived is left alone, and other ports are not its business") {
  listener l, other;
  connection fine(l), elsewhere(other);
  connection_watch watch(l.port, 100ms);
  const auto t0 = connection_watch::clock::now();
  watch.sweep(t0);
  watch.arrived("127.0.0.1", fine.client_port);
  CHECK(watch.sweep(t0 + 1s) == 0);
  CHECK_FALSE(fine.server_shut());
  CHECK_FALSE(elsewhere.server_shut());
  CHECK(watch.timed_out() == 0);
}

TEST_CASE("connection watch: after an answer the next request has the keep-alive time and the deadline") {
  listener l;
  connection c(l);
  connection_watch watch(l.port, 100ms, 1s);
  watch.sweep(connection_watch::clock::now());
  watch.arrived("127.0.0.1", c.client_port);
  const auto answered = connection_watch::clock::now();
  watch.answered("127.0.0.1", c.client_port);
  CHECK(watch.sweep(answered + 1050ms) == 0);
  CHECK_FALSE(c.server_shut());
  CHECK(watch.sweep(answered + 1200ms) == 1);
  CHECK(c.server_shut());
}

TEST_CASE("connection watch: a served connection whose client has closed it is noted as gone, one still open is not") {
  listener l;
  connection left(l), stays(l);
  connection_watch watch(l.port, 10s);
  watch.sweep(connection_watch::clock::now());
  watch.arrived("127.0.0.1", left.client_port);
  watch.arrived("127.0.0.1", stays.client_port);
  watch.sweep(connection_watch::clock::now());
  CHECK_FALSE(watch.gone("127.0.0.1", left.client_port));
  ::shutdown(left.client, SHUT_RDWR);
  // What the client sent before is still unread: the connection's end comes after it.
  char buf[256];
  while (recv(left.server, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
  watch.sweep(connection_watch::clock::now());
  CHECK(watch.gone("127.0.0.1", left.client_port));
  CHECK_FALSE(watch.gone("127.0.0.1", stays.client_port));
  CHECK(watch.timed_out() == 0);
  // The next request on a connection starts afresh.
  watch.answered("127.0.0.1", left.client_port);
  CHECK_FALSE(watch.gone("127.0.0.1", left.client_port));
}

TEST_CASE("connection watch: making room shuts the connection waiting longest for its request, never a served one") {
  listener l;
  connection_watch watch(l.port, 10s);
  const auto t0 = connection_watch::clock::now();
  connection oldest(l), served(l);
  watch.sweep(t0);
  watch.arrived("127.0.0.1", served.client_port);
  connection later(l);
  watch.sweep(t0 + 10ms);
  connection newcomer(l);
  CHECK(watch.shed(t0 + 20ms));  // the newcomer is first seen now: spared
  CHECK(oldest.server_shut());
  CHECK(oldest.client_reads().rfind("HTTP/1.1 408 Request Timeout\r\n", 0) == 0);
  CHECK_FALSE(later.server_shut());
  CHECK_FALSE(newcomer.server_shut());
  CHECK(watch.shed(t0 + 30ms));
  CHECK(later.server_shut());
  CHECK_FALSE(newcomer.server_shut());
  CHECK(watch.shed(t0 + 40ms));
  CHECK(newcomer.server_shut());
  CHECK_FALSE(watch.shed(t0 + 50ms));  // only the served one is left
  CHECK_FALSE(served.server_shut());
  CHECK(watch.timed_out() == 0);  // counted apart from those timed out
}

TEST_CASE("connection watch: at a stop, connections waiting for their request are closed without an answer") {
  listener l;
  connection waiting(l), served(l);
  connection_watch watch(l.port, 10s);
  watch.sweep(connection_watch::clock::now());
  watch.arrived("127.0.0.1", served.client_port);
  connection newcomer(l);  // not yet seen by the watch
  CHECK(watch.close_waiting() == 2);
  CHECK(waiting.server_shut());
  CHECK(newcomer.server_shut());
  CHECK(waiting.client_reads().empty());
  CHECK_FALSE(served.server_shut());
  CHECK(watch.timed_out() == 0);
}
