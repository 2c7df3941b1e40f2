// tls_files: the certificates of a cluster. A cluster CA (an EC P-256 key and a
// self-signed certificate) signs one certificate per node, whose subject is the node's
// name and whose subjectAltName is its host; each node proves itself with its own key and
// trusts exactly the certificates its cluster's CA signed. `troupe-launch certs` writes
// them; a node checks its three files before it listens.
#pragma once

#include <string>

#include "engine/util/expected.hpp"

namespace troupe::tls {

// One node's files: its certificate and key, and the CA that signs every node's.
struct credentials {
  std::string ca;
  std::string cert;
  std::string key;
};

// A new CA: key to key_path (mode 0600) and certificate to cert_path, valid for `days`.
status make_ca(const std::string& cert_path, const std::string& key_path, const std::string& name, int days = 3650);

// A node's certificate signed by the CA at ca_cert/ca_key: subject CN = node, subjectAltName
// the host (an IP address or a DNS name), for both ends of a link (serverAuth, clientAuth).
status issue(const std::string& ca_cert, const std::string& ca_key, const std::string& cert_path,
             const std::string& key_path, const std::string& node, const std::string& host, int days = 825);

// Checks one node's files as the node will use them: each a readable PEM file, the key the
// certificate's, the certificate signed by the CA and valid now. The error names the file
// and what is wrong with it.
status check(const credentials& c);

// "subject CN, issuer CN, valid until DATE" of a PEM certificate, for troupe-launch's report.
expected<std::string> describe(const std::string& cert_path);

}  // namespace troupe::tls
