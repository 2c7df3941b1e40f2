// api_keys: the check both gateways make, and what a key decides besides. No keys
// configured: everything passes. The comparison takes the same time wherever the first
// difference is, so response times do not reveal how much of a key was right.
#pragma once

#include <cstdint>
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

// The prefix-cache namespace of a client's requests: one per API key (a 64-bit FNV-1a of
// it, never 0), so that one tenant's cached prompts neither serve nor reveal (by a faster
// first token) another's; 0, the namespace every request shares, without keys or when
// the deployment shares its cache across keys.
inline uint64_t cache_namespace_of(std::string_view key, bool per_key) {
  if (!per_key || key.empty()) return 0;
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ull;
  return h == 0 ? 1 : h;
}

}  // namespace troupe
