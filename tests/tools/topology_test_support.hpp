// What the topology parser's tests share: a stories260K shape, a topology's fixed part
// (`base`: the model, a gateway, nodes n0 and n1), a replica that fits, and problem(): the
// first mistake parse or validation finds in base plus more ("" when none).
#pragma once

#include <string>

#include <doctest/doctest.h>

#include "engine/model/model.hpp"
#include "tests/support/test_support.hpp"
#include "tools/common/topology.hpp"

namespace troupe::tools::topology_test {

inline model_config stories() {
  auto m = load_model(test::models_dir() + "/stories260K.bin");
  REQUIRE(m.has_value());
  return m->config;
}

inline const char* base = R"(
[model]
path = "m.bin"
[gateway]
node = "n0"
capnp = "127.0.0.1:7400"
[[node]]
name = "n0"
host = "127.0.0.1"
port = 7410
[[node]]
name = "n1"
host = "127.0.0.1"
port = 7411
)";

inline const std::string ok_replica = R"(
[[replica]]
name = "ok"
stages = [ { node = "n0", layers = "0-4", devices = ["cpu"] } ]
)";

// Parses `base` plus a replica section and validates it against stories260K.
inline std::string problem(const std::string& extra) {
  auto t = parse_topology_text(std::string(base) + extra, "t.toml", "/d");
  if (!t) return t.err().message;
  auto v = validate_topology(*t, stories(), 0);
  return v ? "" : v.err().message;
}

}  // namespace troupe::tools::topology_test
