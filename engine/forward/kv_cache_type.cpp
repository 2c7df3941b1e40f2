#include "engine/forward/kv_cache_type.hpp"

#include <cstdlib>

namespace troupe {

expected<dtype> kv_cache_type_named(std::string_view name, const std::string& what) {
  if (auto d = dtype_named(name); d && *d != dtype::bf16) return *d;
  return error{what + ": not a KV cache type (f32, f16, or q8_0: int8 with a scale per token and KV head)"};
}

expected<std::optional<dtype>> kv_cache_type_from_environment() {
  const char* t = std::getenv("TROUPE_KV_TYPE");
  if (!t || !*t) return std::optional<dtype>{};
  auto d = kv_cache_type_named(t, std::string("TROUPE_KV_TYPE=") + t);
  if (!d) return d.err();
  return std::optional<dtype>{*d};
}

dtype kv_cache_type_for(const model& m) {
  if (auto t = kv_cache_type_from_environment(); t && t.value()) return *t.value();
  return m.weight_type == dtype::f32 ? dtype::f32 : dtype::f16;
}

}  // namespace troupe
