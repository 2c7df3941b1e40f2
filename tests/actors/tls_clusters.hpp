// clusters: a scratch directory with two clusters' TLS files, for the link tests: CA "a"
// with nodes a1 and a2, CA "b" with node b1; removed when the object goes.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include <doctest/doctest.h>

#include "actors/tls/tls_context.hpp"
#include "actors/tls/tls_files.hpp"

namespace troupe::test {

struct clusters {
  std::filesystem::path dir;
  clusters() {
    dir = std::filesystem::temp_directory_path() / ("troupe-tls-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    for (const char* ca : {"a", "b"}) REQUIRE(tls::make_ca(path(ca, "pem"), path(ca, "key"), std::string("CA ") + ca));
    for (const char* n : {"a1", "a2"}) REQUIRE(tls::issue(path("a", "pem"), path("a", "key"), path(n, "pem"), path(n, "key"), n, "127.0.0.1"));
    REQUIRE(tls::issue(path("b", "pem"), path("b", "key"), path("b1", "pem"), path("b1", "key"), "b1", "127.0.0.1"));
  }
  ~clusters() { std::filesystem::remove_all(dir); }
  std::string path(const std::string& name, const char* ext) const { return (dir / (name + "." + ext)).string(); }
  tls::credentials of(const std::string& node, const std::string& ca) const {
    return {path(ca, "pem"), path(node, "pem"), path(node, "key")};
  }
  std::shared_ptr<tls::context> context(const std::string& node, const std::string& ca) const {
    auto c = tls::context::load(of(node, ca));
    REQUIRE(c.has_value());
    return *c;
  }
};

}  // namespace troupe::test
