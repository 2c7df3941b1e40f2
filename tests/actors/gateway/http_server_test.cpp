// The event-driven HTTP server against real sockets on 127.0.0.1, and its request reader: framing, keep-alive,
// pipelining, half-closed and departed clients, slow clients and slow readers, the
// connection cap, and draining. Outcomes are asserted, never durations: every wait is
// bounded and only says how long to wait for the outcome.
#include "actors/gateway/http_server.hpp"
#include "actors/gateway/http_reader.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/eventually.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

// A client socket that writes raw bytes and reads what comes.
struct raw_client {
  int fd = -1;
  std::string got;
  bool closed = false;

  explicit raw_client(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~raw_client() {
    if (fd >= 0) ::close(fd);
  }
  void send(const std::string& s) { REQUIRE(::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size())); }
  void half_close() { ::shutdown(fd, SHUT_WR); }
  // Reads for up to `bound`, or until the server closes, or until `until` is in what came.
  void read_for(std::chrono::milliseconds bound, const std::string& until = {}) {
    const auto end = steady::now() + bound;
    while (!closed && steady::now() < end && (until.empty() || got.find(until) == std::string::npos)) {
      pollfd p{fd, POLLIN, 0};
      const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(end - steady::now()).count());
      if (::poll(&p, 1, std::max(1, left)) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        closed = true;
        break;
      }
      got.append(buf, static_cast<size_t>(n));
    }
  }
  size_t count(const std::string& what) const {
    size_t n = 0;
    for (size_t at = got.find(what); at != std::string::npos; at = got.find(what, at + 1)) ++n;
    return n;
  }
};

// A handler that answers each path in its own way.
struct test_handler {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<http::exchange>> held;  // /hold: answered later, by the test
  std::atomic<int> gone{0};
  std::atomic<int> slow_writes_refused{0};

  void operator()(std::shared_ptr<http::exchange> ex) {
    const auto& q = ex->req();
    if (q.path == "/hold") {
      ex->on_gone([this] {
        ++gone;
        cv.notify_all();
      });
      std::lock_guard<std::mutex> lock(mu);
      held.push_back(ex);
      cv.notify_all();
      return;
    }
    if (q.path == "/stream") {
      http::response h;
      h.set("Content-Type", "text/event-stream");
      ex->begin_stream(h);
      for (int i = 0; i < 3; ++i) ex->write("data: " + std::to_string(i) + "\n\n");
      ex->end_stream();
      return;
    }
    if (q.path == "/flood") {  // far more than the reader takes
      ex->on_gone([this] {
        ++gone;
        cv.notify_all();
      });
      http::response h;
      ex->begin_stream(h);
      const std::string block(64 * 1024, 'x');
      for (int i = 0; i < 4096; ++i)
        if (!ex->write(block)) {
          ++slow_writes_refused;
          break;
        }
      ex->end_stream();
      return;
    }
    http::response r;
    r.set("Content-Type", "text/plain");
    r.body = q.method + " " + q.target + " " + std::to_string(q.body.size());
    ex->respond(r);
  }

  std::shared_ptr<http::exchange> wait_held(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, 10s, [&] { return held.size() >= n; });
    return held.size() >= n ? held[n - 1] : nullptr;
  }
  bool wait_gone(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 15s, [&] { return gone.load() >= n; });
  }
};

struct fixture {
  std::shared_ptr<test_handler> h = std::make_shared<test_handler>();
  std::unique_ptr<http::server> srv;
  uint16_t port = 0;
  std::vector<std::string> log;
  std::mutex log_mu;

  explicit fixture(http::server_config cfg = {}) {
    cfg.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(log_mu);
      log.push_back(line);
    };
    srv = std::make_unique<http::server>(cfg, [h = h](std::shared_ptr<http::exchange> ex) { (*h)(std::move(ex)); });
    auto p = srv->start();
    REQUIRE(p);
    port = *p;
  }
};

const std::string get_health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

}  // namespace

TEST_CASE("http server: answers, keeps the connection alive, and answers pipelined requests in order") {
  fixture f;
  raw_client c(f.port);
  c.send(get_health);
  c.read_for(5s, "GET /health 0");
  CHECK(c.got.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(c.got.find("Content-Length: 13\r\n") != std::string::npos);
  CHECK_FALSE(c.closed);
  c.got.clear();
  // Three at once, one with a body; answered in the order sent.
  c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /c HTTP/1.1\r\n\r\n");
  c.read_for(5s, "GET /c 0");
  const size_t a = c.got.find("GET /a 0"), b = c.got.find("POST /b 5"), cc = c.got.find("GET /c 0");
  REQUIRE(a != std::string::npos);
  REQUIRE(b != std::string::npos);
  REQUIRE(cc != std::string::npos);
  CHECK(a < b);
  CHECK(b < cc);
  CHECK_FALSE(c.closed);
  // HEAD: the head alone, and the connection goes on.
  c.got.clear();
  c.send("HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\n\r\n");
  c.read_for(5s, "GET /after 0");
  CHECK(c.got.find("HEAD /h") == std::string::npos);
  CHECK(c.got.find("Content-Length: 9\r\n\r\nHTTP/1.1 200 OK") != std::string::npos);
  CHECK(c.got.find("GET /after 0") != std::string::npos);
}

TEST_CASE("http server: a client that half-closes after its whole request gets its answer") {
  fixture f;
  SUBCASE("HTTP/1.1") {
    raw_client c(f.port);
    c.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
    c.half_close();
    c.read_for(5s);
    CHECK(c.got.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
    CHECK(c.got.find("POST /x 3") != std::string::npos);
    CHECK(c.closed);  // and then the connection ends
  }
  SUBCASE("HTTP/1.0, two pipelined") {
    raw_client c(f.port);
    c.send("GET /one HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /two HTTP/1.0\r\n\r\n");
    c.half_close();
    c.read_for(5s);
    CHECK(c.got.rfind("HTTP/1.0 200 OK\r\n", 0) == 0);
    CHECK(c.got.find("GET /one 0") != std::string::npos);
    CHECK(c.got.find("GET /two 0") != std::string::npos);
    CHECK(c.closed);
  }
  SUBCASE("a held answer, given after the half close") {
    raw_client c(f.port);
    c.send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    c.half_close();
    auto ex = f.h->wait_held(1);
    REQUIRE(ex);
    REQUIRE(test::eventually([&] { return f.srv->stats().half_closed == 1; }));  // the end of input reached the server
    http::response r;
    r.body = "late";
    ex->respond(r);
    c.read_for(5s);
    CHECK(c.got.find("HTTP/1.1 200 OK\r\n") != std::string::npos);
    CHECK(c.got.find("late") != std::string::npos);
    CHECK(f.h->gone == 0);
  }
}

TEST_CASE("http server: a client that closes or resets while its answer is made is gone") {
  fixture f;
  SUBCASE("reset") {
    raw_client c(f.port);
    c.send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    REQUIRE(f.h->wait_held(1));
    linger l{1, 0};  // close with a reset
    ::setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(c.fd);
    c.fd = -1;
    CHECK(f.h->wait_gone(1));
  }
  SUBCASE("closed wholly: found by the interim answer it cannot take") {
    raw_client c(f.port);
    c.send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    REQUIRE(f.h->wait_held(1));
    ::close(c.fd);
    c.fd = -1;
    CHECK(f.h->wait_gone(1));
  }
}

TEST_CASE("http server: a request that does not arrive in time is answered 408, an idle connection closed quietly") {
  http::server_config cfg;
  cfg.read_timeout = 300ms;
  cfg.idle_timeout = 300ms;
  fixture f(cfg);
  raw_client half(f.port), idle(f.port), served(f.port);
  half.send("GET /health HTTP/1.1\r\nHost: x\r\n");
  served.send(get_health);
  served.read_for(5s, "GET /health 0");
  CHECK(served.got.rfind("HTTP/1.1 200", 0) == 0);
  half.read_for(5s);
  idle.read_for(5s);
  CHECK(half.got.rfind("HTTP/1.1 408 Request Timeout\r\n", 0) == 0);
  CHECK(half.closed);
  CHECK(idle.got.empty());
  CHECK(idle.closed);
  served.read_for(5s);
  CHECK(served.closed);  // idle after its answer
  CHECK(f.srv->stats().timed_out == 1);
  f.srv->stop();
  REQUIRE_FALSE(f.log.empty());
  CHECK(f.log[0].find("closed 1 connection(s) that had not sent a whole request within 300 ms") != std::string::npos);
}

TEST_CASE("http server: bad heads and bodies get their status, judged before the body is read") {
  http::server_config cfg;
  cfg.max_body_bytes = 1000;
  cfg.max_head_bytes = 2048;
  fixture f(cfg);
  struct shape {
    std::string sent, status;
  };
  for (const auto& s : {shape{"POST /x HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n{}", "413"},
                        shape{"POST /x HTTP/1.1\r\nContent-Length: 12abc\r\n\r\n{}", "400"},
                        shape{"HELLO\r\n\r\n", "400"},
                        shape{"GET /x HTTP/1.1\r\nX: " + std::string(4000, 'a') + "\r\n\r\n", "431"},
                        shape{"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + std::string(2048, 'b') +
                                  "\r\n0\r\n\r\n",
                              "413"}}) {
    CAPTURE(s.sent.substr(0, 40));
    raw_client c(f.port);
    c.send(s.sent);
    c.read_for(5s);
    CHECK(c.got.rfind("HTTP/1.1 " + s.status, 0) == 0);
    CHECK(c.closed);
  }
  // A chunked body within the limit is read whole.
  raw_client c(f.port);
  c.send("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  c.read_for(5s, "POST /x 5");
  CHECK(c.got.find("POST /x 5") != std::string::npos);
}

TEST_CASE("http server: a client that expects 100-continue is told to go on") {
  fixture f;
  raw_client c(f.port);
  c.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
  c.read_for(5s, "\r\n\r\n");
  CHECK(c.got == "HTTP/1.1 100 Continue\r\n\r\n");
  c.send("abcd");
  c.read_for(5s, "POST /x 4");
  CHECK(c.got.find("POST /x 4") != std::string::npos);
}

TEST_CASE("http server: a stream is chunked over HTTP/1.1, and ends with the connection over HTTP/1.0") {
  fixture f;
  raw_client c11(f.port);
  c11.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  c11.read_for(5s, "0\r\n\r\n");
  CHECK(c11.got.find("Transfer-Encoding: chunked\r\n") != std::string::npos);
  CHECK(c11.got.find("9\r\ndata: 0\n\n\r\n") != std::string::npos);
  CHECK(c11.got.find("9\r\ndata: 2\n\n\r\n0\r\n\r\n") != std::string::npos);
  CHECK_FALSE(c11.closed);
  raw_client c10(f.port);
  c10.send("GET /stream HTTP/1.0\r\n\r\n");
  c10.read_for(5s);
  CHECK(c10.closed);
  CHECK(c10.got.find("Transfer-Encoding") == std::string::npos);
  CHECK(c10.got.find("\r\n\r\ndata: 0\n\ndata: 1\n\ndata: 2\n\n") != std::string::npos);
}

TEST_CASE("http server: a reader that never reads holds at most its stream buffer, and others are served") {
  http::server_config cfg;
  cfg.max_stream_buffer = 256 * 1024;
  fixture f(cfg);
  raw_client slow(f.port);
  ::setsockopt(slow.fd, SOL_SOCKET, SO_RCVBUF, &cfg.max_stream_buffer, sizeof(int));
  slow.send("GET /flood HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(f.h->wait_gone(1));
  CHECK(f.h->slow_writes_refused == 1);
  CHECK(f.srv->stats().slow_readers == 1);
  raw_client other(f.port);
  other.send(get_health);
  other.read_for(5s, "GET /health 0");
  CHECK(other.got.rfind("HTTP/1.1 200", 0) == 0);
}

TEST_CASE("http server: at max_connections a newcomer takes the place of the one waiting longest") {
  http::server_config cfg;
  cfg.max_connections = 4;
  fixture f(cfg);
  std::vector<std::unique_ptr<raw_client>> idle;
  for (uint64_t i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<raw_client>(f.port));
    REQUIRE(test::eventually([&] { return f.srv->stats().accepted == i + 1; }));  // so that the first is the oldest
  }
  raw_client c(f.port);
  c.send(get_health);
  c.read_for(5s, "GET /health 0");
  CHECK(c.got.rfind("HTTP/1.1 200", 0) == 0);
  idle[0]->read_for(5s);
  CHECK(idle[0]->got.rfind("HTTP/1.1 408", 0) == 0);
  CHECK(idle[0]->closed);
  CHECK(f.srv->stats().shed == 1);
  idle[1]->read_for(100ms);
  CHECK_FALSE(idle[1]->closed);
}

TEST_CASE("http server: its threads stay the same however many connections it holds") {
  http::server_config cfg;
  cfg.handler_threads = 2;
  fixture f(cfg);
  std::vector<std::unique_ptr<raw_client>> conns;
  for (int i = 0; i < 300; ++i) conns.push_back(std::make_unique<raw_client>(f.port));
  conns.back()->send(get_health);
  conns.back()->read_for(5s, "GET /health 0");
  CHECK(conns.back()->got.rfind("HTTP/1.1 200", 0) == 0);
  const auto st = f.srv->stats();
  CHECK(st.open == 300);
  CHECK(st.threads == 3);
}

TEST_CASE("http server: stop drains: an answer in flight is finished with Connection: close, idle ones closed") {
  fixture f;
  raw_client idle(f.port), busy(f.port);
  busy.send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
  auto ex = f.h->wait_held(1);
  REQUIRE(ex);
  std::thread stopper([&] { f.srv->stop(5s); });
  idle.read_for(5s);
  CHECK(idle.closed);
  http::response r;
  r.body = "finished";
  ex->respond(r);
  busy.read_for(5s);
  stopper.join();
  CHECK(busy.got.find("Connection: close\r\n") != std::string::npos);
  CHECK(busy.got.find("finished") != std::string::npos);
  CHECK(busy.closed);
  CHECK(f.h->gone == 0);
}

TEST_CASE("http server: stop closes connections whose request has not arrived, without waiting for them") {
  fixture f;
  std::vector<std::unique_ptr<raw_client>> half;
  for (int i = 0; i < 20; ++i) {
    half.push_back(std::make_unique<raw_client>(f.port));
    half.back()->send("GET /health HTTP/1.1\r\nHost: x\r\n");
  }
  raw_client probe(f.port);
  probe.send(get_health);
  probe.read_for(5s, "GET /health 0");  // every half request has been read by now
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    f.srv->stop(60s);
    stopped = true;
  });
  for (auto& c : half) {
    c->read_for(5s);
    CHECK(c->closed);
  }
  CHECK(test::eventually([&] { return stopped.load(); }, 5s));  // long before the drain's bound
  stopper.join();
}

TEST_CASE("http reader: requests fed a byte at a time, chunked with trailers, pipelined, and refusals") {
  http::request_reader::limits lim;
  lim.max_head_bytes = 256;
  lim.max_body_bytes = 64;
  http::request_reader r(lim);
  const std::string two = "POST /a?q=1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"
                          "GET /b HTTP/1.0\r\n\r\n";
  std::vector<http::request> got;
  std::vector<bool> keep;
  for (char c : two) {
    r.add(std::string_view(&c, 1));
    while (r.step() == http::request_reader::state::request) {
      bool k = false;
      got.push_back(r.take(k));
      keep.push_back(k);
    }
  }
  REQUIRE(got.size() == 2);
  CHECK(got[0].method == "POST");
  CHECK(got[0].path == "/a");
  CHECK(got[0].target == "/a?q=1");
  CHECK(got[0].body == "abc");
  CHECK(keep[0]);
  CHECK(got[1].version == 10);
  CHECK_FALSE(keep[1]);  // HTTP/1.0 without keep-alive
  CHECK(r.buffered() == 0);
  // A body past the limit, declared or chunked, and a head that is not HTTP.
  for (const auto& [bad, status] : std::vector<std::pair<std::string, int>>{
           {"POST /x HTTP/1.1\r\nContent-Length: 65\r\n\r\n", 413},
           {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n41\r\n" + std::string(65, 'z'), 413},
           {"GET /x HTTP/1.1\r\nX: " + std::string(300, 'h') + "\r\n\r\n", 431},
           {"HELLO\r\n\r\n", 400}}) {
    http::request_reader b(lim);
    b.add(bad);
    CHECK(b.step() == http::request_reader::state::refused);
    CHECK(b.why().status == status);
  }
  // The limit is the whole head's, however it arrives: many short fields in pieces of any
  // size, a head of exactly the limit served, one byte more refused.
  for (size_t size : {size_t{200}, size_t{255}, size_t{256}, size_t{257}, size_t{300}, size_t{700}}) {
    std::string head = "GET /x HTTP/1.1\r\n";  // 17 bytes, then fields of 6, one to fill, the end
    const size_t fields = (size - 17 - 2 - 5) / 6;
    for (size_t i = 0; i < fields; ++i) head += "A: b\r\n";
    head += "Z: " + std::string(size - 17 - fields * 6 - 2 - 5, 'z') + "\r\n\r\n";
    REQUIRE(head.size() == size);
    for (size_t piece : {size_t{1}, size_t{7}, size_t{64}, size_t{200}, size_t{256}, size_t{1000}}) {
      CAPTURE(size);
      CAPTURE(piece);
      http::request_reader h(lim);
      auto st = http::request_reader::state::need_more;
      for (size_t at = 0; at < head.size() && st == http::request_reader::state::need_more; at += piece) {
        h.add(std::string_view(head).substr(at, piece));
        st = h.step();
      }
      if (size <= 256) {
        CHECK(st == http::request_reader::state::request);
      } else {
        REQUIRE(st == http::request_reader::state::refused);
        CHECK(h.why().status == 431);
      }
    }
  }
  // Expect: 100-continue, once, when the head is whole and the body is not.
  http::request_reader e(lim);
  e.add("POST /x HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n");
  CHECK(e.step() == http::request_reader::state::need_more);
  CHECK(e.wants_continue());
  CHECK_FALSE(e.wants_continue());
  e.add("ok");
  CHECK(e.step() == http::request_reader::state::request);
}
