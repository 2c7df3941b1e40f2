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

}  // namespace troupe::tls
