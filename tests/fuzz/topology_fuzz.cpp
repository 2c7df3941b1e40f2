// The topology parser, given any text: a topology or an error naming the file and line.
#include <string>

#include "tools/common/topology.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)troupe::tools::parse_topology_text(text, "fuzz.toml", "/nonexistent");
  return 0;
}
