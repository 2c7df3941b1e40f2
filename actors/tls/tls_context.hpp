// tls_context: one node's TLS 1.3 configuration, shared by every link it opens or accepts:
// its certificate and key, and the cluster's CA as the only one it trusts. Both ends of a
// link show a certificate and check the other's (mutual authentication): a peer without a
// certificate, or with one another CA signed, fails the handshake.
#pragma once

#include <memory>
#include <string>

#include <openssl/ssl.h>

#include "actors/tls/tls_files.hpp"
#include "engine/util/expected.hpp"

namespace troupe::tls {

class context {
 public:
  // Checks the files (tls::check) and builds the context; the error names what is wrong.
  static expected<std::shared_ptr<context>> load(const credentials& c);
  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  SSL_CTX* get() const { return ctx_; }
  const credentials& files() const { return files_; }

 private:
  context(SSL_CTX* ctx, credentials files) : ctx_(ctx), files_(std::move(files)) {}
  SSL_CTX* ctx_;
  credentials files_;
};

// Why a handshake failed, in an operator's words: the peer showed no certificate, one that
// is not of this cluster (OpenSSL's verify result), spoke no TLS, or closed the connection.
// Reads (and empties) OpenSSL's error queue of this thread.
std::string handshake_failure(SSL* ssl, int ret);

// OpenSSL's error queue of this thread as one line (emptied), or `fallback` when empty.
std::string error_queue(const char* fallback);

struct ssl_free {
  void operator()(SSL* s) const { SSL_free(s); }
};
using ssl_ptr = std::unique_ptr<SSL, ssl_free>;

struct ssl_ctx_free {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using ssl_ctx_ptr = std::unique_ptr<SSL_CTX, ssl_ctx_free>;

// A fresh SSL_CTX of `method` that speaks `min_version` or later (this thread's OpenSSL
// errors cleared first), or why there is none.
expected<ssl_ctx_ptr> new_ssl_ctx(const SSL_METHOD* method, int min_version);
// A step of building one failed: `what` (the file it read, say) and OpenSSL's reasons.
error failed(const std::string& what);

}  // namespace troupe::tls
