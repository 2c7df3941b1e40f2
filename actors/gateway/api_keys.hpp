// api_keys: the keys file, the check both gateways make, and what a key decides besides.
// No keys configured: everything passes. The comparison takes the same time wherever the
// first difference is, so response times do not reveal how much of a key was right. Both
// APIs read a key the same way: without the spaces, tabs and line ends around it (an HTTP
// header's value is trimmed so; a Cap'n Proto client's key and the file's lines alike).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

// A key as written, without the whitespace around it (spaces, tabs, CR, LF).
inline std::string_view trimmed_key(std::string_view k) {
  const size_t b = k.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return k.substr(b, k.find_last_not_of(" \t\r\n") + 1 - b);
}

// The keys of an API keys file: one a line, each trimmed (a file written with CRLF line
// ends reads the same); blank lines and lines starting with '#' are skipped.
inline std::vector<std::string> parse_api_keys(std::string_view text) {
  std::vector<std::string> keys;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = trimmed_key(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (!line.empty() && line[0] != '#') keys.emplace_back(line);
  }
  return keys;
}

inline bool same_key(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

inline bool key_allowed(const std::vector<std::string>& keys, std::string_view given) {
  if (keys.empty()) return true;
  given = trimmed_key(given);
  if (given.empty()) return false;
  bool ok = false;
  for (const auto& k : keys) ok |= same_key(k, given);
  return ok;
}

// The prefix-cache namespace of a client's requests: one per API key (a 64-bit FNV-1a of
// it, never 0), so that one tenant's cached prompts neither serve nor reveal (by a faster
// first token) another's; 0, the namespace every request shares, without keys or when
// the deployment shares its cache across keys.
inline uint64_t cache_namespace_of(std::string_view key, bool per_key) {
  key = trimmed_key(key);
  if (!per_key || key.empty()) return 0;
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ull;
  return h == 0 ? 1 : h;
}

}  // namespace troupe
