#include "actors/tls/kj_tls.hpp"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <climits>

#include "actors/tls/tls_context.hpp"

namespace troupe::tls {

namespace {

kj::Exception disconnected(const std::string& why) {
  return kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__, kj::str("TLS: ", why.c_str()));
}

class kj_tls_stream final : public kj::AsyncIoStream {
 public:
  kj_tls_stream(kj::Own<kj::AsyncIoStream> inner, ssl_ptr ssl) : inner_(kj::mv(inner)), ssl_(std::move(ssl)) {
    BIO* in = BIO_new(BIO_s_mem());
    BIO* out = BIO_new(BIO_s_mem());
    BIO_set_mem_eof_return(in, -1);  // no bytes yet: try again, not the end
    SSL_set_bio(ssl_.get(), in, out);  // the SSL object owns both
    in_ = in;
    out_ = out;
  }

  // Runs the handshake to its end; `server` says which side this is.
  kj::Promise<void> handshake(bool server) {
    ERR_clear_error();
    const int r = SSL_do_handshake(ssl_.get());
    if (r == 1) return flush();
    const int e = SSL_get_error(ssl_.get(), r);
    if (e == SSL_ERROR_WANT_READ) {
      queue_output();
      return fill().then([this, server](bool more) -> kj::Promise<void> {
        if (!more) return disconnected("the peer closed the connection during the handshake");
        return handshake(server);
      });
    }
    const std::string why = server ? handshake_failure(ssl_.get(), r) : client_failure(r);
    queue_output();  // the alert that says so, if any
    return write_chain_.addBranch().then([why]() -> kj::Promise<void> { return disconnected(why); },
                                         [why](kj::Exception&&) -> kj::Promise<void> { return disconnected(why); });
  }

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    return read_some(static_cast<kj::byte*>(buffer), min_bytes, max_bytes, 0);
  }

  kj::Promise<void> write(const void* buffer, size_t size) override {
    encrypt(static_cast<const kj::byte*>(buffer), size);
    return flush();
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    for (const auto& piece : pieces) encrypt(piece.begin(), piece.size());
    return flush();
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override {
    SSL_shutdown(ssl_.get());  // close_notify, then the socket's write side
    queue_output();
    auto done = write_chain_.addBranch().then([this] { inner_->shutdownWrite(); }).eagerlyEvaluate(nullptr).fork();
    write_chain_ = kj::mv(done);
  }
  void abortRead() override { inner_->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override { inner_->getsockname(addr, length); }
  void getpeername(struct sockaddr* addr, kj::uint* length) override { inner_->getpeername(addr, length); }

 private:
  // Why a client's handshake failed: the gateway's certificate, or the usual reasons.
  std::string client_failure(int ret) {
    const long verify = SSL_get_verify_result(ssl_.get());
    if (verify != X509_V_OK)
      return std::string("the gateway's certificate is not trusted (") + X509_verify_cert_error_string(verify) +
             "); name the CA that signed it with --ca or TROUPE_CA";
    return handshake_failure(ssl_.get(), ret);
  }

  void encrypt(const kj::byte* p, size_t n) {
    while (n > 0) {  // into memory: never waits
      ERR_clear_error();
      const int r = SSL_write(ssl_.get(), p, static_cast<int>(std::min<size_t>(n, INT_MAX)));
      if (r <= 0) throw disconnected(error_queue("cannot encrypt"));
      p += r;
      n -= static_cast<size_t>(r);
    }
  }

  kj::Promise<size_t> read_some(kj::byte* buf, size_t min_bytes, size_t max_bytes, size_t got) {
    for (;;) {
      if (got >= max_bytes) return got;
      ERR_clear_error();
      const int r = SSL_read(ssl_.get(), buf + got, static_cast<int>(std::min<size_t>(max_bytes - got, INT_MAX)));
      if (r > 0) {
        got += static_cast<size_t>(r);
        if (got >= min_bytes) return got;
        continue;
      }
      const int e = SSL_get_error(ssl_.get(), r);
      if (e == SSL_ERROR_ZERO_RETURN) return got;  // close_notify: the end
      if (e != SSL_ERROR_WANT_READ) throw disconnected(error_queue("the connection broke"));
      queue_output();  // what reading produced to send (a key update's answer), not waited for
      return fill().then([this, buf, min_bytes, max_bytes, got](bool more) -> kj::Promise<size_t> {
        if (!more) return got;  // the socket's end
        return read_some(buf, min_bytes, max_bytes, got);
      });
    }
  }

  // Ciphertext from the socket into OpenSSL: false at the end of the stream.
  kj::Promise<bool> fill() {
    return inner_->tryRead(in_buf_, 1, sizeof in_buf_).then([this](size_t n) {
      if (n == 0) return false;
      BIO_write(in_, in_buf_, static_cast<int>(n));
      return true;
    });
  }

  // Ciphertext OpenSSL has made goes out after what went before it, in order.
  void queue_output() {
    const size_t pending = BIO_ctrl_pending(out_);
    if (pending == 0) return;
    auto bytes = kj::heapArray<kj::byte>(pending);
    BIO_read(out_, bytes.begin(), static_cast<int>(pending));
    auto next = write_chain_.addBranch()
                    .then([this, bytes = kj::mv(bytes)]() mutable {
                      auto& b = bytes;
                      return inner_->write(b.begin(), b.size()).attach(kj::mv(bytes));
                    })
                    .eagerlyEvaluate(nullptr)
                    .fork();
    write_chain_ = kj::mv(next);
  }
  kj::Promise<void> flush() {
    queue_output();
    return write_chain_.addBranch();
  }

  kj::Own<kj::AsyncIoStream> inner_;
  ssl_ptr ssl_;
  BIO* in_ = nullptr;
  BIO* out_ = nullptr;
  kj::ForkedPromise<void> write_chain_ = kj::Promise<void>(kj::READY_NOW).fork();
  kj::byte in_buf_[16384];
};

kj::Promise<kj::Own<kj::AsyncIoStream>> start_tls(const endpoint_context& ctx, kj::Own<kj::AsyncIoStream> s,
                                              const std::string& host) {
  ERR_clear_error();
  ssl_ptr ssl(SSL_new(ctx.get()));
  if (!ssl) return disconnected(error_queue("cannot start TLS"));
  const bool server = ctx.is_server();
  if (server) {
    SSL_set_accept_state(ssl.get());
  } else {
    SSL_set_connect_state(ssl.get());
    // The certificate must name the host: its address, or its name (also sent as SNI).
    in6_addr ip;
    if (::inet_pton(AF_INET, host.c_str(), &ip) == 1 || ::inet_pton(AF_INET6, host.c_str(), &ip) == 1) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), host.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl.get(), host.c_str());
      SSL_set1_host(ssl.get(), host.c_str());
    }
  }
  auto t = kj::heap<kj_tls_stream>(kj::mv(s), std::move(ssl));
  auto& ref = *t;
  return ref.handshake(server).then([t = kj::mv(t)]() mutable -> kj::Own<kj::AsyncIoStream> { return kj::mv(t); });
}

}  // namespace

expected<std::shared_ptr<endpoint_context>> endpoint_context::server(const std::string& cert, const std::string& key) {
  auto made = new_ssl_ctx(TLS_server_method(), TLS1_2_VERSION);
  if (!made) return made.err();
  SSL_CTX* ctx = made->get();
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1) return failed(cert);
  if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    const error e = failed(key);
    if (e.message.find("mismatch") == std::string::npos) return e;
    return error{key + ": not the key of " + cert};
  }
  return std::shared_ptr<endpoint_context>(new endpoint_context(made->release(), true));
}

expected<std::shared_ptr<endpoint_context>> endpoint_context::client(const std::string& ca_file) {
  auto made = new_ssl_ctx(TLS_client_method(), TLS1_2_VERSION);
  if (!made) return made.err();
  SSL_CTX* ctx = made->get();
  const bool loaded = ca_file.empty() ? SSL_CTX_set_default_verify_paths(ctx) == 1
                                      : SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) == 1;
  if (!loaded) return failed(ca_file.empty() ? std::string("the system's CAs") : ca_file);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  return std::shared_ptr<endpoint_context>(new endpoint_context(made->release(), false));
}

endpoint_context::~endpoint_context() { SSL_CTX_free(ctx_); }

kj::Promise<kj::Own<kj::AsyncIoStream>> accept_tls(const endpoint_context& ctx, kj::Own<kj::AsyncIoStream> s) {
  return start_tls(ctx, kj::mv(s), "");
}

kj::Promise<kj::Own<kj::AsyncIoStream>> connect_tls(const endpoint_context& ctx, kj::Own<kj::AsyncIoStream> s,
                                                    const std::string& host) {
  return start_tls(ctx, kj::mv(s), host);
}

}  // namespace troupe::tls
