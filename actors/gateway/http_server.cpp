#include "actors/gateway/http_server.hpp"
#include "actors/gateway/http_reader.hpp"

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

namespace {

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

template <class Fields>
std::string find_header(const Fields& fields, std::string_view name) {
  for (const auto& f : fields)
    if (same_name(f.name, name)) return f.value;
  return {};
}

}  // namespace

std::string request::header(std::string_view name) const { return find_header(headers, name); }

bool request::has(std::string_view name) const {
  for (const auto& f : headers)
    if (same_name(f.name, name)) return true;
  return false;
}

void response::set(std::string_view name, std::string value) {
  for (auto& f : headers)
    if (same_name(f.name, name)) {
      f.value = std::move(value);
      return;
    }
  headers.push_back({std::string(name), std::move(value)});
}

std::string response::header(std::string_view name) const { return find_header(headers, name); }

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

namespace {

// The head of an answer: the status line, the headers given, the framing, the connection.
std::string head_text(const response& r, unsigned version, const std::string& framing, bool close, bool keep_alive_10) {
  std::string h = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  h += std::to_string(r.status);
  h += ' ';
  h += reason_phrase(r.status);
  h += "\r\n";
  for (const auto& f : r.headers) {
    if (same_name(f.name, "Content-Length") || same_name(f.name, "Transfer-Encoding") || same_name(f.name, "Connection"))
      continue;
    h += f.name;
    h += ": ";
    h += f.value;
    h += "\r\n";
  }
  h += framing;
  if (close)
    h += "Connection: close\r\n";
  else if (keep_alive_10)
    h += "Connection: keep-alive\r\n";
  h += "\r\n";
  return h;
}

const std::string continue_line = "HTTP/1.1 100 Continue\r\n\r\n";

response default_error_page(int status, const std::string& message, const std::string&) {
  response r;
  r.status = status;
  r.set("Content-Type", "text/plain; charset=utf-8");
  r.body = message + "\n";
  return r;
}

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

}  // namespace

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
  std::atomic<uint64_t> accepted{0}, timed_out{0}, shed{0}, slow_readers{0}, refused_tls{0};

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

namespace {

class exchange_impl;

}  // namespace

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

namespace {

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

}  // namespace

void connection::start() {
  if (srv_.ssl) {
    tls_.emplace(std::move(sock_), *srv_.ssl);
    tls_buffer_.resize(16 * 1024);
    phase_ = phase::handshake;
    arm(srv_.cfg.tls_handshake_timeout);
    tls_->async_handshake(asio::ssl::stream_base::server,
                          [self = shared_from_this()](const boost::system::error_code& ec) { self->handshaken(ec); });
    return;
  }
  enter_idle();
  read();
}

void connection::cut_off() {
  leave_waiting();
  disarm();
  phase_ = phase::closing;
  stop_reading_ = true;
  const response r = srv_.cfg.error_page(408, "the request did not arrive in time", "timeout");
  send_now(head_text(r, 11, "Content-Length: " + std::to_string(r.body.size()) + "\r\n", true, false) + r.body);
}

void connection::close() {
  if (phase_ == phase::closed) return;
  const bool lost = phase_ == phase::serving && current_ && (!answer_done_ || !out_.empty());
  phase_ = phase::closed;
  leave_waiting();
  ++gen_;
  ++write_gen_;
  timer_.cancel();
  write_timer_.cancel();
  if (probe_) probe_->cancel();
  boost::system::error_code ec;
  lowest().shutdown(tcp::socket::shutdown_both, ec);
  lowest().close(ec);
  if (streaming_) {
    streaming_ = false;
    --srv_.streaming;
  }
  if (lost) current_->mark_gone();
  current_.reset();
  out_.clear();
  --srv_.open;
  if (srv_.cfg.on_connection) srv_.cfg.on_connection(-1);
  srv_.conns.erase(this);  // the caller holds it still
}

void connection::drain() {
  if (phase_ == phase::handshake || phase_ == phase::idle || phase_ == phase::reading)
    close();
  else
    keep_alive_ = false;
}

void connection::arm(std::chrono::milliseconds after) {
  const uint64_t g = ++gen_;
  timer_.expires_after(after);
  timer_.async_wait([self = shared_from_this(), g](const boost::system::error_code& ec) {
    if (!ec && g == self->gen_) self->deadline();
  });
}

void connection::deadline() {
  switch (phase_) {
    case phase::handshake:
      ++srv_.refused_tls;
      ++srv_.unreported_tls;
      if (srv_.first_tls_reason.empty()) srv_.first_tls_reason = "no handshake within the time allowed; one from " + peer_;
      srv_.report();
      return close();
    case phase::idle:
      return close();  // quietly: a keep-alive connection left unused
    case phase::reading:
      ++srv_.timed_out;
      ++srv_.unreported_late;
      if (srv_.first_late.empty()) srv_.first_late = peer_;
      srv_.report();
      return cut_off();
    case phase::closing:
      return close();  // a last answer nobody takes
    default:
      return;
  }
}

void connection::handshaken(const boost::system::error_code& ec) {
  if (phase_ == phase::closed) return;
  if (ec) {
    ++srv_.refused_tls;
    ++srv_.unreported_tls;
    if (srv_.first_tls_reason.empty()) srv_.first_tls_reason = ec.message() + "; one from " + peer_;
    srv_.report();
    return close();
  }
  enter_idle();
  read();
}

void connection::enter_idle() {
  phase_ = phase::idle;
  if (!in_waiting) {
    waiting_at = srv_.waiting.insert(srv_.waiting.end(), this);
    in_waiting = true;
  }
  arm(srv_.cfg.idle_timeout);
}

void connection::read() {
  if (reading_ || stop_reading_ || peer_eof_ || phase_ == phase::closed || phase_ == phase::closing) return;
  if (phase_ == phase::serving && reader_.buffered() >= srv_.cfg.max_head_bytes) return;  // enough read ahead
  reading_ = true;
  auto self = shared_from_this();
  if (tls_) {
    tls_->async_read_some(asio::buffer(tls_buffer_), [self](const boost::system::error_code& ec, size_t n) {
      self->reading_ = false;
      self->got(ec, self->tls_buffer_.data(), n);
    });
    return;
  }
  // A plain connection waits for bytes without a buffer of its own; they are read into the
  // server's, and what is not parsed at once is kept here.
  sock_.async_wait(tcp::socket::wait_read, [self](const boost::system::error_code& ec) {
    self->reading_ = false;
    if (ec) return self->got(ec, nullptr, 0);
    if (self->phase_ == phase::closed) return;
    boost::system::error_code rec;
    const size_t n = self->sock_.read_some(asio::buffer(self->srv_.read_buffer), rec);
    if (rec == asio::error::would_block || rec == asio::error::try_again) return self->read();
    self->got(rec, self->srv_.read_buffer.data(), n);
  });
}

void connection::got(const boost::system::error_code& ec, const char* data, size_t n) {
  if (phase_ == phase::closed || ec == asio::error::operation_aborted) return;
  if (ec == asio::error::eof || (tls_ && ec == asio::ssl::error::stream_truncated)) return end_of_input();
  if (ec) return close();  // reset, or worse: the client is gone
  if (n == 0) return read();
  if (phase_ == phase::closing) return;  // what comes after a last answer is not read
  reader_.add(std::string_view(data, n));
  if (phase_ == phase::idle) {
    phase_ = phase::reading;
    arm(srv_.cfg.read_timeout);
  }
  if (phase_ == phase::reading) return parse();
  read();  // serving: what a pipelining client sends ahead waits in the reader
}

// The client will send nothing more: a request begun will not end; one being served still
// gets its answer (a half-closed connection), then the connection closes.
void connection::end_of_input() {
  peer_eof_ = true;
  if (phase_ == phase::serving) {
    if (version_ == 11 && !answer_begun_) schedule_probe();
    return;
  }
  if (phase_ == phase::closing) return;  // its last answer is being written
  close();
}

// Whether a client that has stopped sending has closed the connection wholly, not only its
// sending half: an interim "100 Continue", which HTTP/1.1 clients read past, meets a reset
// from a client that has gone, and the next look says so. First after two seconds (a quick
// answer needs none), then every two seconds until the answer begins.
void connection::schedule_probe() {
  if (!probe_) probe_ = std::make_unique<asio::steady_timer>(srv_.io);
  probe_->expires_after(std::chrono::seconds(2));
  probe_->async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->phase_ != phase::serving || self->answer_begun_) return;
    if (self->reset_seen()) return self->close();
    self->send_now(continue_line);
    self->schedule_probe();
  });
}

bool connection::reset_seen() {
  char c;
  const ssize_t r = ::recv(lowest().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

void connection::parse() {
  switch (reader_.step()) {
    case request_reader::state::refused: {
      const request_reader::refusal& why = reader_.why();
      return refuse(why.status, why.message, "");
    }
    case request_reader::state::need_more:
      if (peer_eof_) return close();  // it will not end
      // A client that asked to be told before it sends its body is told now.
      if (reader_.wants_continue()) send_now(continue_line);
      return read();
    case request_reader::state::request:
      break;
  }
  // A whole request: it is served.
  bool keep_alive = true;
  request r = reader_.take(keep_alive);
  leave_waiting();
  disarm();
  phase_ = phase::serving;
  answer_begun_ = answer_done_ = false;
  r.peer = peer_;
  version_ = r.version;
  head_only_ = r.method == "HEAD";
  keep_alive_ = keep_alive && !srv_.draining;
  current_ = std::make_shared<exchange_impl>(srv_, weak_from_this(), std::move(r));
  srv_.dispatch(current_);
  if (peer_eof_ && version_ == 11) schedule_probe();
  read();  // a reset, a half close, or the next request, while this one is served
}

void connection::refuse(int status, const std::string& message, const std::string& code) {
  leave_waiting();
  disarm();
  phase_ = phase::closing;
  stop_reading_ = true;
  const response r = srv_.cfg.error_page(status, message, code);
  send_now(head_text(r, 11, "Content-Length: " + std::to_string(r.body.size()) + "\r\n", true, false) + r.body);
}

// After an answer written whole: the next request (read already, perhaps), or idling.
void connection::next() {
  current_.reset();
  if (!keep_alive_ || srv_.draining) return finish();
  if (reader_.buffered() == 0) {
    if (peer_eof_) return finish();
    enter_idle();
    return read();
  }
  phase_ = phase::reading;
  arm(srv_.cfg.read_timeout);
  parse();
  read();
}

// Closes once everything queued is written (a TLS connection says close_notify first).
void connection::finish() {
  phase_ = phase::closing;
  if (writing_) return;
  arm(std::chrono::seconds(2));  // at most this long (the phase's deadline closes it)
  if (tls_) {
    tls_->async_shutdown([self = shared_from_this()](const boost::system::error_code&) { self->close(); });
    return;
  }
  // A lingering close: the sending half first, then whatever the client still sends (the
  // rest of a refused body) is read and dropped until it closes too. Closing at once with
  // unread bytes would reset the connection, and the client could lose the answer.
  boost::system::error_code ec;
  sock_.shutdown(tcp::socket::shutdown_send, ec);
  discard();
}

void connection::discard() {
  sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->phase_ == phase::closed) return;
    boost::system::error_code rec;
    for (int i = 0; i < 16 && !rec; ++i) self->sock_.read_some(asio::buffer(self->srv_.read_buffer), rec);
    if (rec && rec != asio::error::would_block && rec != asio::error::try_again) return self->close();
    self->discard();
  });
}

void connection::respond(const exchange_impl* ex, response r) {
  if (ex != current_.get() || answer_begun_ || phase_ != phase::serving) return;
  answer_begun_ = answer_done_ = true;
  if (srv_.draining) keep_alive_ = false;
  const bool close = !keep_alive_;
  // An answer to HEAD is its head alone (the length says what GET would have sent).
  send_now(head_text(r, version_, "Content-Length: " + std::to_string(r.body.size()) + "\r\n", close, version_ == 10 && !close) +
           (head_only_ ? std::string() : r.body));
}

void connection::begin_stream(const exchange_impl* ex, response head) {
  if (ex != current_.get() || answer_begun_ || phase_ != phase::serving) return;
  answer_begun_ = true;
  streaming_ = true;
  ++srv_.streaming;
  chunked_ = version_ == 11;
  if (!chunked_ || srv_.draining) keep_alive_ = false;  // over HTTP/1.0 the answer ends where the connection does
  send_now(head_text(head, version_, chunked_ ? "Transfer-Encoding: chunked\r\n" : "", !keep_alive_, false));
}

void connection::write(const exchange_impl* ex, std::string bytes, size_t credit) {
  if (ex != current_.get() || !streaming_ || bytes.empty()) return;
  if (!chunked_) return send_now(std::move(bytes), credit);
  char size[24];
  std::snprintf(size, sizeof size, "%zx\r\n", bytes.size());
  bytes.insert(0, size);
  bytes += "\r\n";
  send_now(std::move(bytes), credit);
}

void connection::end_stream(const exchange_impl* ex) {
  if (ex != current_.get() || !streaming_) return;
  streaming_ = false;
  --srv_.streaming;
  answer_done_ = true;
  if (chunked_) send_now("0\r\n\r\n");
  else if (!writing_) write_next();  // nothing more to write: on to the close
}

void connection::send_now(std::string bytes, size_t credit) {
  if (phase_ == phase::closed) return;
  out_.push_back({std::move(bytes), credit});
  if (!writing_) write_next();
}

void connection::write_next() {
  if (phase_ == phase::closed) return;
  if (out_.empty()) {
    writing_ = false;
    ++write_gen_;
    write_timer_.cancel();
    std::deque<piece>().swap(out_);
    if (phase_ == phase::closing) return finish();
    if (phase_ == phase::serving && answer_done_) return next();
    return;
  }
  writing_ = true;
  const uint64_t g = ++write_gen_;
  write_timer_.expires_after(srv_.cfg.write_timeout);
  write_timer_.async_wait([self = shared_from_this(), g](const boost::system::error_code& ec) {
    if (!ec && g == self->write_gen_) self->close();  // the client took nothing for write_timeout
  });
  // Up to 16 queued pieces in one call.
  std::vector<asio::const_buffer> bufs;
  for (const auto& p : out_) {
    const size_t off = bufs.empty() ? out_offset_ : 0;
    bufs.emplace_back(p.bytes.data() + off, p.bytes.size() - off);
    if (bufs.size() == 16) break;
  }
  auto done = [self = shared_from_this()](const boost::system::error_code& ec, size_t n) { self->wrote(ec, n); };
  if (tls_)
    tls_->async_write_some(bufs, done);
  else
    sock_.async_write_some(bufs, done);
}

void connection::wrote(const boost::system::error_code& ec, size_t n) {
  if (phase_ == phase::closed) return;
  if (ec) return close();  // the client is gone
  while (n > 0 && !out_.empty()) {
    const size_t left = out_.front().bytes.size() - out_offset_;
    if (n < left) {
      out_offset_ += n;
      break;
    }
    n -= left;
    if (current_ && out_.front().credit) current_->sent(out_.front().credit);
    out_.pop_front();
    out_offset_ = 0;
  }
  write_next();
}

void server::impl::accept() {
  acceptor.async_accept([self = shared_from_this()](const boost::system::error_code& ec, tcp::socket s) {
    if (!self->accepting) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors, or the like: a moment's pause, then on.
      auto t = std::make_shared<asio::steady_timer>(self->io, std::chrono::milliseconds(50));
      if (ec == asio::error::no_descriptors || ec == asio::error::no_memory) self->make_room();
      t->async_wait([self, t](const boost::system::error_code&) { self->accept(); });
      return;
    }
    self->admit(std::move(s));
    self->accept();
  });
}

void server::impl::admit(tcp::socket s) {
  if (draining) return;
  // (The one making room closes once its 408 is written: until then both are held.)
  if (conns.size() >= cfg.max_connections && !make_room()) return;  // every connection busy: this one is closed
  auto c = std::make_shared<connection>(*this, std::move(s));
  conns.emplace(c.get(), c);
  ++open;
  ++accepted;
  if (cfg.on_connection) cfg.on_connection(+1);
  c->start();
}

bool server::impl::make_room() {
  if (waiting.empty()) return false;
  connection* c = waiting.front();
  waiting.pop_front();
  c->in_waiting = false;
  ++shed;
  ++unreported_shed;
  if (cfg.on_connection) cfg.on_connection(0);
  report();
  c->cut_off();
  return true;
}

void server::impl::report(bool force) {
  const auto now = clock_type::now();
  if (unreported_late + unreported_shed + unreported_tls == 0) return;
  if (!force && now - last_report < std::chrono::seconds(10)) return;
  last_report = now;
  if (!cfg.log) {
    unreported_late = unreported_shed = unreported_tls = 0;
    return;
  }
  if (unreported_late + unreported_shed > 0) {
    std::string line = "closed ";
    if (unreported_late > 0)
      line += std::to_string(unreported_late) + " connection(s) that had not sent a whole request within " +
              std::to_string(cfg.read_timeout.count()) + " ms";
    if (unreported_late > 0 && unreported_shed > 0) line += ", and ";
    if (unreported_shed > 0)
      line += std::to_string(unreported_shed) +
              " waiting for their request to make room for new ones (max_connections reached)";
    line += " (answered 408)";
    if (!first_late.empty()) line += "; one from " + first_late.substr(0, first_late.rfind(':'));
    cfg.log(line);
  }
  if (unreported_tls > 0)
    cfg.log("refused " + std::to_string(unreported_tls) + " TLS handshake(s): " + first_tls_reason);
  unreported_late = unreported_shed = unreported_tls = 0;
  first_late.clear();
  first_tls_reason.clear();
}

server::server(server_config cfg, handler h) : impl_(std::make_shared<impl>(std::move(cfg), std::move(h))) {}

server::~server() { stop(std::chrono::milliseconds(0)); }

expected<uint16_t> server::start() {
  impl& s = *impl_;
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(s.cfg.host == "localhost" ? "127.0.0.1" : s.cfg.host, ec);
  if (ec) return error{"http: cannot listen on " + s.cfg.host + ": not an IP address"};
  const tcp::endpoint ep(addr, s.cfg.port);
  s.acceptor.open(ep.protocol(), ec);
  if (!ec) s.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(ep, ec);
  if (!ec) s.acceptor.listen(SOMAXCONN, ec);
  if (ec) return error{"http: cannot listen on " + s.cfg.host + ":" + std::to_string(s.cfg.port) + ": " + ec.message()};
  if (s.cfg.tls) {
    SSL_CTX_up_ref(s.cfg.tls);
    s.ssl.emplace(s.cfg.tls);
  }
  s.workers = std::make_unique<worker_pool>(s.cfg.handler_threads);
  s.accept();
  auto done = std::make_shared<std::promise<void>>();
  s.io_done = done->get_future().share();
  s.io_thread = std::thread([p = impl_, done] {
    pthread_setname_np(pthread_self(), "http-io");
    p->io.run();
    done->set_value();
  });
  return s.acceptor.local_endpoint().port();
}

void server::stop(std::chrono::milliseconds drain) {
  impl& s = *impl_;
  if (!s.io_thread.joinable()) return;
  // Stop accepting; close connections waiting for a request; the rest close after their
  // answers.
  asio::post(s.io, [p = impl_] {
    p->accepting = false;
    p->draining = true;
    boost::system::error_code ec;
    p->acceptor.close(ec);
    std::vector<std::shared_ptr<connection>> all;
    for (auto& [_, c] : p->conns) all.push_back(c);
    for (auto& c : all) c->drain();
  });
  const auto until = clock_type::now() + drain;
  while (clock_type::now() < until) {
    auto left = std::make_shared<std::promise<size_t>>();
    auto f = left->get_future();
    asio::post(s.io, [p = impl_, left] { left->set_value(p->conns.size()); });
    if (f.wait_for(std::chrono::seconds(1)) == std::future_status::ready && f.get() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The rest are closed; with nothing left to wait for, the I/O thread's run() returns once
  // every handler has run (and let go of what it held: the server among them).
  asio::post(s.io, [p = impl_] {
    std::vector<std::shared_ptr<connection>> all;
    for (auto& [_, c] : p->conns) all.push_back(c);
    for (auto& c : all) c->close();
    p->report(true);
    p->keep_running.reset();
  });
  if (s.io_done.wait_for(std::chrono::seconds(2)) != std::future_status::ready) s.io.stop();  // (never seen)
  s.io_thread.join();
  s.workers->stop();
}

server_stats server::stats() const {
  const impl& s = *impl_;
  server_stats st;
  st.open = s.open.load();
  st.streaming = s.streaming.load();
  st.accepted = s.accepted.load();
  st.timed_out = s.timed_out.load();
  st.shed = s.shed.load();
  st.slow_readers = s.slow_readers.load();
  st.refused_tls = s.refused_tls.load();
  st.threads = 1 + (s.workers ? s.workers->size() : 0);
  return st;
}

}  // namespace troupe::http
