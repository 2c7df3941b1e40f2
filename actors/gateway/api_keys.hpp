// api_keys: the check both gateways make. No keys configured: everything passes. The
// comparison takes the same time wherever the first difference is, so response times do
// not reveal how much of a key was right.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace troupe {

inline bool same_key(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

inline bool key_allowed(const std::vector<std::string>& keys, std::string_view given) {
  if (keys.empty()) return true;
  bool ok = false;
  for (const auto& k : keys) ok |= same_key(k, given);
  return ok;
}

}  // namespace troupe
