// http_server's inside, shared by its files: http_server.cpp (requests and answers, the
// server, its accept loop and its stop) and http_connection.cpp (one client connection:
// reading requests, writing answers, its deadlines). Internal to actors/gateway.
#pragma once

#include "actors/gateway/http_reader.hpp"
#include "actors/gateway/http_server.hpp"

#include <pthread.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <strings.h>
#include <sys/socket.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <future>
#include <list>
#include <optional>
#include <thread>
#include <unordered_map>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>

namespace troupe::http {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

// Whether two header names are the same (HTTP names are case-insensitive).
bool same_name(std::string_view a, std::string_view b);
// The head of an answer: the status line, the headers given, the framing, the connection.
std::string head_text(const response& r, unsigned version, const std::string& framing, bool close, bool keep_alive_10);
// An interim answer: go on (the body), or (to a client that has stopped sending) a probe.
extern const std::string continue_line;
response default_error_page(int status, const std::string& message, const std::string& code);

// Jobs for a fixed number of threads.
class worker_pool {
 public:
  explicit worker_pool(size_t n) {
    for (size_t i = 0; i < std::max<size_t>(1, n); ++i)
      threads_.emplace_back([this] {
        pthread_setname_np(pthread_self(), "http-handler");  // (top -H, gdb)
        work();
      });
  }
  ~worker_pool() { stop(); }
  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      jobs_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }
  // Runs what is queued, then joins.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  size_t size() const { return threads_.size(); }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

class connection;

struct server::impl : std::enable_shared_from_this<server::impl> {
  server_config cfg;
  handler on_request;
  asio::io_context io{1};
  // Keeps the I/O thread running until stop() ends it, connections or none.
  asio::executor_work_guard<asio::io_context::executor_type> keep_running = asio::make_work_guard(io);
  tcp::acceptor acceptor{io};
  std::optional<asio::ssl::context> ssl;
  std::thread io_thread;
  std::shared_future<void> io_done;  // its run() has returned
  std::unique_ptr<worker_pool> workers;

  // On the I/O thread only.
  std::unordered_map<connection*, std::shared_ptr<connection>> conns;
  std::list<connection*> waiting;  // for a request, longest first
  bool accepting = true, draining = false;
  std::vector<char> read_buffer = std::vector<char>(64 * 1024);  // plain reads land here first
  uint64_t unreported_late = 0, unreported_shed = 0, unreported_tls = 0;
  std::string first_late, first_tls_reason;
  clock_type::time_point last_report{};

  std::atomic<int64_t> open{0}, streaming{0};
  std::atomic<uint64_t> accepted{0}, timed_out{0}, shed{0}, slow_readers{0}, refused_tls{0}, half_closed{0};

  impl(server_config c, handler h) : cfg(std::move(c)), on_request(std::move(h)) {
    if (!cfg.error_page) cfg.error_page = default_error_page;
  }

  void accept();
  void admit(tcp::socket s);
  bool make_room();  // whether a connection waiting for its request was let go
  void report(bool force = false);
  void dispatch(std::shared_ptr<exchange> ex) {
    workers->post([this, ex = std::move(ex)] { on_request(ex); });
  }
};

class exchange_impl;

// One client connection, on the I/O thread only.
class connection : public std::enable_shared_from_this<connection> {
 public:
  // handshake (TLS) -> idle (no byte of a request yet) -> reading (a request arriving) ->
  // serving (its answer being made and written) -> idle ...; closing: a last answer (a
  // refusal, a 408, the answer before a close) is written, then the connection closes.
  enum class phase { handshake, idle, reading, serving, closing, closed };

  connection(server::impl& s, tcp::socket sock)
      : srv_(s), sock_(std::move(sock)), timer_(s.io), write_timer_(s.io),
        reader_({s.cfg.max_head_bytes, s.cfg.max_body_bytes}) {
    boost::system::error_code ec;
    const auto ep = sock_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    sock_.non_blocking(true, ec);
    sock_.set_option(tcp::no_delay(true), ec);
  }

  void start();
  // Answered 408 and closed: its request did not come in time, or room is needed.
  void cut_off();
  // Closes at once. A client whose answer was not written whole is gone.
  void close();
  // The server drains: a connection waiting for a request closes now, one being served
  // closes once its answer is written.
  void drain();

  // From the exchange, on the I/O thread.
  void respond(const exchange_impl* ex, response r);
  void begin_stream(const exchange_impl* ex, response head);
  void write(const exchange_impl* ex, std::string bytes, size_t credit);
  void end_stream(const exchange_impl* ex);

  std::list<connection*>::iterator waiting_at;  // in the server's list, while in_waiting
  bool in_waiting = false;

 private:
  // Bytes to write; `credit`: a stream's bytes they carry, released once written.
  struct piece {
    std::string bytes;
    size_t credit = 0;
  };

  tcp::socket& lowest() { return tls_ ? tls_->next_layer() : sock_; }

  void arm(std::chrono::milliseconds after);
  void disarm() {
    ++gen_;
    timer_.cancel();
  }
  void deadline();
  void handshaken(const boost::system::error_code& ec);
  void enter_idle();
  void leave_waiting() {
    if (!in_waiting) return;
    srv_.waiting.erase(waiting_at);
    in_waiting = false;
  }
  void read();
  void got(const boost::system::error_code& ec, const char* data, size_t n);
  void end_of_input();
  void schedule_probe();
  bool reset_seen();
  void parse();
  // A last answer of the server's own (the connection closes after it).
  void refuse(int status, const std::string& message, const std::string& code);
  void next();
  void finish();
  void discard();
  void send_now(std::string bytes, size_t credit = 0);
  void write_next();
  void wrote(const boost::system::error_code& ec, size_t n);

  server::impl& srv_;
  tcp::socket sock_;
  std::optional<asio::ssl::stream<tcp::socket>> tls_;
  std::vector<char> tls_buffer_;
  asio::steady_timer timer_;        // the phase's deadline (handshake, idle, reading)
  asio::steady_timer write_timer_;  // progress of a write
  std::unique_ptr<asio::steady_timer> probe_;
  uint64_t gen_ = 0, write_gen_ = 0;
  std::string peer_;
  phase phase_ = phase::idle;

  request_reader reader_;  // what has been read, into requests
  bool reading_ = false, stop_reading_ = false, peer_eof_ = false;

  std::shared_ptr<exchange_impl> current_;  // the request being served
  unsigned version_ = 11;
  bool keep_alive_ = true, answer_begun_ = false, answer_done_ = false, streaming_ = false, chunked_ = false;
  bool head_only_ = false;  // a HEAD request: no body in the answer

  std::deque<piece> out_;
  size_t out_offset_ = 0;  // into out_.front()
  bool writing_ = false;
};

class exchange_impl final : public exchange, public std::enable_shared_from_this<exchange_impl> {
 public:
  exchange_impl(server::impl& s, std::weak_ptr<connection> c, request r)
      : srv_(s), conn_(std::move(c)), req_(std::move(r)) {}

  const request& req() const override { return req_; }

  void respond(response r) override {
    on_io([r = std::move(r)](connection& c, exchange_impl* ex) mutable { c.respond(ex, std::move(r)); });
  }
  void begin_stream(response head) override {
    on_io([h = std::move(head)](connection& c, exchange_impl* ex) mutable { c.begin_stream(ex, std::move(h)); });
  }
  bool write(std::string bytes) override {
    if (gone_) return false;
    const size_t n = bytes.size();
    if (pending_.fetch_add(n) + n > srv_.cfg.max_stream_buffer) {
      // The reader has fallen too far behind: the stream is over.
      slow_ = true;
      on_io([](connection& c, exchange_impl*) { c.close(); });
      return false;
    }
    on_io([b = std::move(bytes), n](connection& c, exchange_impl* ex) mutable { c.write(ex, std::move(b), n); });
    return true;
  }
  void end_stream() override {
    on_io([](connection& c, exchange_impl* ex) { c.end_stream(ex); });
  }
  void on_gone(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (gone_) {
      lock.unlock();
      fn();
      return;
    }
    gone_fn_ = std::move(fn);
  }
  bool gone() const override { return gone_; }

  // On the I/O thread.
  void mark_gone() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gone_) return;
      gone_ = true;
      fn = std::move(gone_fn_);
    }
    if (slow_) {
      ++srv_.slow_readers;
      if (srv_.cfg.on_slow_reader) srv_.cfg.on_slow_reader();
    }
    if (fn) fn();
  }
  void sent(size_t credit) { pending_.fetch_sub(credit); }

 private:
  template <class F>
  void on_io(F f) {
    asio::post(srv_.io, [w = conn_, ex = shared_from_this(), f = std::move(f)]() mutable {
      if (auto c = w.lock()) f(*c, ex.get());
    });
  }

  server::impl& srv_;
  std::weak_ptr<connection> conn_;
  request req_;
  std::mutex mu_;
  std::function<void()> gone_fn_;
  std::atomic<bool> gone_{false}, slow_{false};
  std::atomic<size_t> pending_{0};  // stream bytes written and not yet sent
};

}  // namespace troupe::http
