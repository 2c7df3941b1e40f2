#include "actors/tls/tls_files.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace troupe::tls {

namespace {

template <class T, void (*Free)(T*)>
struct freer {
  void operator()(T* p) const { Free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, freer<EVP_PKEY, EVP_PKEY_free>>;
using x509_ptr = std::unique_ptr<X509, freer<X509, X509_free>>;
using store_ptr = std::unique_ptr<X509_STORE, freer<X509_STORE, X509_STORE_free>>;
using store_ctx_ptr = std::unique_ptr<X509_STORE_CTX, freer<X509_STORE_CTX, X509_STORE_CTX_free>>;

// OpenSSL's queued reasons, oldest first, or `fallback` when it queued none.
std::string ssl_reason(const char* fallback) {
  std::string r;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    r += (r.empty() ? "" : "; ") + std::string(buf);
  }
  return r.empty() ? fallback : r;
}

struct file_closer {
  void operator()(FILE* f) const { std::fclose(f); }
};
using file_ptr = std::unique_ptr<FILE, file_closer>;

expected<x509_ptr> read_cert(const std::string& path) {
  file_ptr f(std::fopen(path.c_str(), "rb"));
  if (!f) return error{path + ": cannot open"};
  x509_ptr x(PEM_read_X509(f.get(), nullptr, nullptr, nullptr));
  if (!x) return error{path + ": not a PEM certificate (" + ssl_reason("no certificate found") + ")"};
  return x;
}

expected<pkey_ptr> read_key(const std::string& path) {
  file_ptr f(std::fopen(path.c_str(), "rb"));
  if (!f) return error{path + ": cannot open"};
  pkey_ptr k(PEM_read_PrivateKey(f.get(), nullptr, nullptr, nullptr));
  if (!k) return error{path + ": not a PEM private key without a passphrase (" + ssl_reason("no key found") + ")"};
  return k;
}

status write_pem(const std::string& path, bool secret, X509* cert, EVP_PKEY* key) {
  // A key is created 0600 from the start, never readable by others for a moment (and an
  // existing file is made so before it is written).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, secret ? 0600 : 0644);
  if (fd < 0) return error{path + ": cannot write"};
  if (secret) ::fchmod(fd, 0600);
  file_ptr f(::fdopen(fd, "wb"));
  if (!f) {
    ::close(fd);
    return error{path + ": cannot write"};
  }
  const bool ok = cert ? PEM_write_X509(f.get(), cert) == 1
                       : PEM_write_PrivateKey(f.get(), key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  if (!ok || std::fflush(f.get()) != 0) return error{path + ": " + ssl_reason("cannot write")};
  return ok_t{};
}

status add_ext(X509* x, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, x, nullptr, nullptr, 0);
  X509_EXTENSION* e = X509V3_EXT_nconf_nid(nullptr, &ctx, nid, value.c_str());
  if (!e) return error{"extension " + std::string(OBJ_nid2sn(nid)) + " = " + value + ": " + ssl_reason("refused")};
  X509_add_ext(x, e, -1);
  X509_EXTENSION_free(e);
  return ok_t{};
}

// A certificate for `key`, named CN=cn, valid from an hour ago for `days`, its serial random.
expected<x509_ptr> new_cert(EVP_PKEY* key, const std::string& cn, int days) {
  x509_ptr x(X509_new());
  X509_set_version(x.get(), 2);
  BIGNUM* serial = BN_new();
  BN_rand(serial, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY);
  BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(x.get()));
  BN_free(serial);
  X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(x.get(), key);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(x.get()), "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  return x;
}

expected<pkey_ptr> new_key() {
  pkey_ptr k(EVP_EC_gen("P-256"));
  if (!k) return error{"cannot make a P-256 key: " + ssl_reason("no reason given")};
  return k;
}

std::string common_name(X509_NAME* n) {
  char buf[256] = {};
  X509_NAME_get_text_by_NID(n, NID_commonName, buf, sizeof buf);
  return buf;
}

}  // namespace

status make_ca(const std::string& cert_path, const std::string& key_path, const std::string& name, int days) {
  auto key = new_key();
  if (!key) return key.err();
  auto x = new_cert(key->get(), name, days);
  if (!x) return x.err();
  X509_set_issuer_name(x->get(), X509_get_subject_name(x->get()));
  for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                            std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
                            std::pair{NID_subject_key_identifier, "hash"}})
    if (auto s = add_ext(x->get(), x->get(), nid, value); !s) return s;
  if (X509_sign(x->get(), key->get(), EVP_sha256()) == 0) return error{"cannot sign the CA: " + ssl_reason("no reason")};
  if (auto s = write_pem(key_path, true, nullptr, key->get()); !s) return s;
  return write_pem(cert_path, false, x->get(), nullptr);
}

status issue(const std::string& ca_cert, const std::string& ca_key, const std::string& cert_path,
             const std::string& key_path, const std::string& node, const std::string& host, int days) {
  auto ca = read_cert(ca_cert);
  if (!ca) return ca.err();
  auto ca_pkey = read_key(ca_key);
  if (!ca_pkey) return ca_pkey.err();
  if (X509_check_private_key(ca->get(), ca_pkey->get()) != 1)
    return error{ca_key + ": not the key of " + ca_cert + " (" + ssl_reason("mismatch") + ")"};
  auto key = new_key();
  if (!key) return key.err();
  auto x = new_cert(key->get(), node, days);
  if (!x) return x.err();
  X509_set_issuer_name(x->get(), X509_get_subject_name(ca->get()));
  unsigned char ip[16];
  const bool is_ip = inet_pton(AF_INET, host.c_str(), ip) == 1 || inet_pton(AF_INET6, host.c_str(), ip) == 1;
  const std::string san = (is_ip ? "IP:" : "DNS:") + host;
  for (auto [nid, value] : {std::pair<int, std::string>{NID_basic_constraints, "critical,CA:FALSE"},
                            {NID_key_usage, "critical,digitalSignature,keyAgreement"},
                            {NID_ext_key_usage, "serverAuth,clientAuth"},
                            {NID_subject_alt_name, san},
                            {NID_subject_key_identifier, "hash"},
                            {NID_authority_key_identifier, "keyid:always"}})
    if (auto s = add_ext(x->get(), ca->get(), nid, value); !s) return error{node + "'s certificate: " + s.err().message};
  if (X509_sign(x->get(), ca_pkey->get(), EVP_sha256()) == 0)
    return error{"cannot sign " + node + "'s certificate: " + ssl_reason("no reason")};
  if (auto s = write_pem(key_path, true, nullptr, key->get()); !s) return s;
  return write_pem(cert_path, false, x->get(), nullptr);
}

status check(const credentials& c) {
  auto ca = read_cert(c.ca);
  if (!ca) return ca.err();
  auto cert = read_cert(c.cert);
  if (!cert) return cert.err();
  auto key = read_key(c.key);
  if (!key) return key.err();
  if (X509_check_private_key(cert->get(), key->get()) != 1)
    return error{c.key + ": not the key of " + c.cert + " (" + ssl_reason("mismatch") + ")"};
  store_ptr store(X509_STORE_new());
  X509_STORE_add_cert(store.get(), ca->get());
  store_ctx_ptr ctx(X509_STORE_CTX_new());
  X509_STORE_CTX_init(ctx.get(), store.get(), cert->get(), nullptr);
  if (X509_verify_cert(ctx.get()) != 1)
    return error{c.cert + ": " + X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get())) + " (checked against " +
                 c.ca + ", the cluster's CA)"};
  return ok_t{};
}

expected<std::string> describe(const std::string& cert_path) {
  auto x = read_cert(cert_path);
  if (!x) return x.err();
  BIO* b = BIO_new(BIO_s_mem());
  ASN1_TIME_print(b, X509_get0_notAfter(x->get()));
  char* text = nullptr;
  const long n = BIO_get_mem_data(b, &text);
  std::string until(text, static_cast<size_t>(n));
  BIO_free(b);
  return common_name(X509_get_subject_name(x->get())) + ", signed by " + common_name(X509_get_issuer_name(x->get())) +
         ", valid until " + until;
}

}  // namespace troupe::tls
