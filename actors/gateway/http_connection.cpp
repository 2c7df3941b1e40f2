// One client connection of the HTTP server (http_server_parts.hpp), on its I/O thread.
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>

#include "actors/gateway/http_server_parts.hpp"

namespace troupe::http {

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
    ++srv_.half_closed;
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

}  // namespace troupe::http
