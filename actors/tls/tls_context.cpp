#include "actors/tls/tls_context.hpp"

#include <openssl/err.h>
#include <openssl/x509.h>

#include "engine/util/link_stream.hpp"

namespace troupe::tls {

std::string error_queue(const char* fallback) {
  std::string r;
  while (const unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    std::string one = reason ? reason : "error " + std::to_string(ERR_GET_REASON(e));
    if (r.find(one) == std::string::npos) r += (r.empty() ? "" : "; ") + one;
  }
  return r.empty() ? fallback : r;
}

expected<ssl_ctx_ptr> new_ssl_ctx(const SSL_METHOD* method, int min_version) {
  ERR_clear_error();
  ssl_ctx_ptr ctx(SSL_CTX_new(method));
  if (!ctx) return error{"cannot make a TLS context: " + error_queue("no reason given")};
  SSL_CTX_set_min_proto_version(ctx.get(), min_version);
  return ctx;
}

error failed(const std::string& what) { return error{what + ": " + error_queue("no reason given")}; }

expected<std::shared_ptr<context>> context::load(const credentials& c) {
  if (auto s = check(c); !s) return s.err();
  auto made = new_ssl_ctx(TLS_method(), TLS1_3_VERSION);
  if (!made) return made.err();
  SSL_CTX* ctx = made->get();
  // CAF's write buffer may move between the tries of one write; partial writes are counted.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx, 0);
  if (SSL_CTX_use_certificate_chain_file(ctx, c.cert.c_str()) != 1) return failed(c.cert);
  if (SSL_CTX_use_PrivateKey_file(ctx, c.key.c_str(), SSL_FILETYPE_PEM) != 1) return failed(c.key);
  if (SSL_CTX_check_private_key(ctx) != 1) return failed(c.key);
  if (SSL_CTX_load_verify_locations(ctx, c.ca.c_str(), nullptr) != 1) return failed(c.ca);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return std::shared_ptr<context>(new context(made->release(), c));
}

context::~context() { SSL_CTX_free(ctx_); }

std::string handshake_failure(SSL* ssl, int ret) {
  const int e = SSL_get_error(ssl, ret);
  const long verify = SSL_get_verify_result(ssl);
  const std::string queue = error_queue("");
  if (verify != X509_V_OK)
    return std::string("its certificate is not of this cluster (") + X509_verify_cert_error_string(verify) + ")";
  if (queue.find("peer did not return a certificate") != std::string::npos) return "it showed no certificate";
  if (queue.find("wrong version number") != std::string::npos || queue.find("packet length too long") != std::string::npos ||
      queue.find("http request") != std::string::npos || queue.find("record layer failure") != std::string::npos)
    return "it does not speak TLS (" + queue + ")";
  if (queue.find("unknown ca") != std::string::npos)
    return "it does not trust this node's certificate (" + queue + "): a node of another cluster?";
  if (queue.find("certificate") != std::string::npos || queue.find("alert") != std::string::npos)
    return "the peer refused the handshake (" + queue + ")";
  // (OpenSSL 3 says "unexpected eof while reading" where earlier ones gave a syscall error.)
  if (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN || queue.find("unexpected eof") != std::string::npos)
    return closed_in_handshake;
  return queue.empty() ? "the TLS handshake failed" : "the TLS handshake failed (" + queue + ")";
}

}  // namespace troupe::tls
