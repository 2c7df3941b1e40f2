#include "tools/troupe-launch/certs.hpp"

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "actors/tls/tls_files.hpp"

namespace troupe::tools {

namespace fs = std::filesystem;

namespace {

bool make_dirs(const std::string& file) {
  std::error_code ec;
  const fs::path dir = fs::path(file).parent_path();
  if (dir.empty() || fs::is_directory(dir)) return true;
  fs::create_directories(dir, ec);
  if (ec) std::fprintf(stderr, "troupe-launch certs: cannot make %s: %s\n", dir.c_str(), ec.message().c_str());
  return !ec;
}

void report(const char* what, const std::string& cert) {
  auto d = tls::describe(cert);
  std::printf("%s %s (%s)\n", what, cert.c_str(), d ? d->c_str() : d.err().message.c_str());
}

}  // namespace

int make_certs(const topology& topo, bool renew) {
  const tls_section& t = topo.tls;
  if (!t.on()) {
    std::fprintf(stderr,
                 "troupe-launch certs: %s has no [tls] table to name the files; add one, for example\n\n"
                 "  [tls]\n  ca = \"certs/ca.pem\"\n  cert = \"certs/{node}.pem\"\n  key = \"certs/{node}.key\"\n",
                 topo.path.c_str());
    return 2;
  }
  const std::string ca_key = t.ca_key();
  const bool have_ca = fs::exists(t.ca), have_key = fs::exists(ca_key);
  if (have_ca != have_key) {
    std::fprintf(stderr, "troupe-launch certs: %s exists without %s: restore it, or remove both to make a new CA "
                         "(every node then needs new certificates)\n",
                 (have_ca ? t.ca : ca_key).c_str(), (have_ca ? ca_key : t.ca).c_str());
    return 1;
  }
  if (!have_ca) {
    if (!make_dirs(t.ca) || !make_dirs(ca_key)) return 1;
    const std::string name = "troupe cluster CA (" + fs::path(topo.path).stem().string() + ")";
    if (auto s = tls::make_ca(t.ca, ca_key, name); !s) {
      std::fprintf(stderr, "troupe-launch certs: %s\n", s.err().message.c_str());
      return 1;
    }
    report("made the cluster's CA", t.ca);
  } else {
    report("kept the cluster's CA", t.ca);
  }
  std::vector<std::pair<std::string, std::string>> holders;  // name, host
  for (const node_spec& n : topo.nodes) holders.emplace_back(n.name, n.host);
  holders.emplace_back(tls_section::operator_name, "localhost");
  for (const auto& [name, host] : holders) {
    const tls::credentials c{t.ca, t.cert_of(name), t.key_of(name)};
    if (!renew && fs::exists(c.cert) && fs::exists(c.key)) {
      if (auto ok = tls::check(c); ok) {
        report("kept", c.cert);
        continue;
      } else {
        std::printf("replacing %s: %s\n", c.cert.c_str(), ok.err().message.c_str());
      }
    }
    if (!make_dirs(c.cert) || !make_dirs(c.key)) return 1;
    if (auto s = tls::issue(t.ca, ca_key, c.cert, c.key, name, host); !s) {
      std::fprintf(stderr, "troupe-launch certs: %s\n", s.err().message.c_str());
      return 1;
    }
    report("wrote", c.cert);
  }
  std::printf("each node needs %s and its own certificate and key; %s signs new ones and stays here\n", t.ca.c_str(),
              ca_key.c_str());
  return 0;
}

}  // namespace troupe::tools
