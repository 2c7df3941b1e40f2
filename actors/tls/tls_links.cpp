#include "actors/tls/tls_links.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>

#include <openssl/err.h>

namespace troupe::tls {

namespace {

// Writes up to this size go out as one TLS record (a step's header and its plan, say);
// larger parts go one by one.
constexpr size_t coalesce_bytes = 16 * 1024;

// Waits until fd is ready for `events`, at most timeout_ms (-1: no limit): false when the
// time passed first.
bool wait_for(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r > 0;
  }
}

class tls_link final : public link_stream {
 public:
  tls_link(int fd, ssl_ptr ssl) : link_stream(fd), ssl_(std::move(ssl)) {}

  void set_timeout(int seconds) override { timeout_ms_ = seconds > 0 ? seconds * 1000 : -1; }

  bool read_exact(void* buf, size_t n) override { return whole(SSL_read, static_cast<char*>(buf), n); }

  ptrdiff_t read_some(void* buf, size_t n) override {
    const auto [r, e] = call([&](SSL* s) { return SSL_read(s, buf, static_cast<int>(std::min<size_t>(n, INT_MAX))); });
    if (r > 0) return r;
    return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
  }

  bool write_all(std::initializer_list<std::pair<const void*, size_t>> parts) override {
    std::lock_guard<std::mutex> turn(writing_);
    size_t total = 0;
    for (const auto& [p, n] : parts) total += n;
    if (total <= coalesce_bytes) {
      out_.clear();
      for (const auto& [p, n] : parts) out_.insert(out_.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
      return whole(SSL_write, out_.data(), out_.size());
    }
    for (const auto& [p, n] : parts)
      if (!whole(SSL_write, static_cast<const char*>(p), n)) return false;
    return true;
  }

  bool secured() const override { return true; }

  bool buffered() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return SSL_pending(ssl_.get()) > 0;
  }

 private:
  struct result {
    int ret, err;
  };
  // One OpenSSL call under the lock, with its own error queue.
  template <class F>
  result call(F f) {
    std::lock_guard<std::mutex> lock(mutex_);
    ERR_clear_error();
    const int r = f(ssl_.get());
    const int e = r > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl_.get(), r);
    ERR_clear_error();
    return {r, e};
  }
  // After a call that could not go on: waits for the socket as OpenSSL asked; false when
  // the connection is over (closed, broken, refused) or the wait timed out.
  bool wait(int err) {
    if (err == SSL_ERROR_WANT_READ) return wait_for(fd(), POLLIN, timeout_ms_);
    if (err == SSL_ERROR_WANT_WRITE) return wait_for(fd(), POLLOUT, timeout_ms_);
    return false;
  }
  // All n bytes through `io` (SSL_read, or SSL_write: partial writes are the context's
  // mode), waiting for the socket between calls as OpenSSL asks.
  template <class Io, class Byte>
  bool whole(Io io, Byte* p, size_t n) {
    while (n > 0) {
      const auto [r, e] = call([&](SSL* s) { return io(s, p, static_cast<int>(std::min<size_t>(n, INT_MAX))); });
      if (r > 0) {
        p += r;
        n -= static_cast<size_t>(r);
      } else if (!wait(e)) {
        return false;
      }
    }
    return true;
  }

  mutable std::mutex mutex_;  // every call on ssl_
  std::mutex writing_;        // one write_all at a time (out_)
  ssl_ptr ssl_;
  std::vector<char> out_;
  int timeout_ms_ = -1;
};

class tls_guard final : public link_guard {
 public:
  explicit tls_guard(std::shared_ptr<context> ctx) : ctx_(std::move(ctx)) {}
  std::string name() const override { return "TLS 1.3"; }
  expected<std::unique_ptr<link_stream>> client(int fd, int timeout_ms) const override {
    return handshake(fd, false, timeout_ms);
  }
  expected<std::unique_ptr<link_stream>> server(int fd, int timeout_ms) const override {
    return handshake(fd, true, timeout_ms);
  }

 private:
  expected<std::unique_ptr<link_stream>> handshake(int fd, bool server, int timeout_ms) const {
    auto fail = [&](const std::string& why) -> error {
      ::close(fd);
      return error{why};
    };
    if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) return fail(std::strerror(errno));
    ERR_clear_error();
    ssl_ptr ssl(SSL_new(ctx_->get()));
    if (!ssl || SSL_set_fd(ssl.get(), fd) != 1) return fail("cannot start TLS: " + error_queue("no reason given"));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      ERR_clear_error();
      const int r = server ? SSL_accept(ssl.get()) : SSL_connect(ssl.get());
      if (r == 1) break;
      const int e = SSL_get_error(ssl.get(), r);
      if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) return fail(handshake_failure(ssl.get(), r));
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !wait_for(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, static_cast<int>(left.count())))
        return fail("no TLS handshake within " + std::to_string(timeout_ms) + " ms");
    }
    return std::unique_ptr<link_stream>(new tls_link(fd, std::move(ssl)));
  }

  std::shared_ptr<context> ctx_;
};

}  // namespace

std::shared_ptr<const link_guard> link_guard_of(std::shared_ptr<context> ctx) {
  return std::make_shared<tls_guard>(std::move(ctx));
}

}  // namespace troupe::tls
