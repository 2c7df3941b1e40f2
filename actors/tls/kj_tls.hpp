// kj_tls: the Cap'n Proto endpoint over TLS. A gateway with a certificate and key
// (`[gateway]` tls_cert, tls_key) speaks TLS to its clients; a client that names the
// endpoint capnps://HOST:PORT checks the gateway's certificate against a CA file (the
// system's trusted CAs by default) and the host name. Clients show API keys, not
// certificates.
//
// A TLS stream is a kj::AsyncIoStream over another: OpenSSL encrypts into and decrypts
// from memory buffers, and the bytes travel on the connection's own event loop, so a
// connection costs no thread, as a plain one does not.
#pragma once

#include <memory>
#include <string>

#include <kj/async-io.h>
#include <openssl/ssl.h>

#include "engine/util/expected.hpp"

namespace troupe::tls {

class endpoint_context {
 public:
  // The gateway's side: its certificate (a chain, PEM) and key; TLS 1.2 or later.
  static expected<std::shared_ptr<endpoint_context>> server(const std::string& cert, const std::string& key);
  // A client's side: trusts the CAs in ca_file (PEM), or the system's when empty.
  static expected<std::shared_ptr<endpoint_context>> client(const std::string& ca_file);
  ~endpoint_context();
  endpoint_context(const endpoint_context&) = delete;
  endpoint_context& operator=(const endpoint_context&) = delete;

  SSL_CTX* get() const { return ctx_; }
  bool is_server() const { return server_; }

 private:
  endpoint_context(SSL_CTX* ctx, bool server) : ctx_(ctx), server_(server) {}
  SSL_CTX* ctx_;
  bool server_;
};

// The TLS stream over `s` once the handshake is done, as the server (a client's
// connection) or as a client of `host` (whose name the certificate must carry). A failed
// handshake is a DISCONNECTED exception saying why.
kj::Promise<kj::Own<kj::AsyncIoStream>> accept_tls(const endpoint_context& ctx, kj::Own<kj::AsyncIoStream> s);
kj::Promise<kj::Own<kj::AsyncIoStream>> connect_tls(const endpoint_context& ctx, kj::Own<kj::AsyncIoStream> s,
                                                    const std::string& host);

}  // namespace troupe::tls
