// The API keys file as operators write it (blank lines, comments, CRLF, stray spaces), and
// the same reading of a presented key on both APIs.
#include "actors/gateway/api_keys.hpp"

#include <doctest/doctest.h>

namespace troupe {

TEST_CASE("an API keys file: keys trimmed, blank and comment lines skipped, CRLF the same as LF") {
  CHECK(parse_api_keys("keyA\nkeyB\n") == std::vector<std::string>{"keyA", "keyB"});
  CHECK(parse_api_keys("keyA\r\nkeyB\r\n") == std::vector<std::string>{"keyA", "keyB"});
  CHECK(parse_api_keys("  keyA \t\n\n   \n\t\r\n# a comment\n  # indented comment\nkeyD \nkeyE") ==
        std::vector<std::string>{"keyA", "keyD", "keyE"});
  CHECK(parse_api_keys("").empty());
  CHECK(parse_api_keys(" \n\r\n\t\n").empty());  // whitespace is never a key
}

TEST_CASE("a presented key is read without the whitespace around it, on either API") {
  const std::vector<std::string> keys = parse_api_keys("keyA\r\nkeyD \n");
  CHECK(key_allowed(keys, "keyA"));
  CHECK(key_allowed(keys, "keyD"));
  CHECK(key_allowed(keys, "keyD "));  // as a Cap'n Proto client may send it
  CHECK(key_allowed(keys, " keyA\r\n"));
  CHECK_FALSE(key_allowed(keys, ""));
  CHECK_FALSE(key_allowed(keys, " "));
  CHECK_FALSE(key_allowed(keys, "keyA\r"  "x"));
  CHECK_FALSE(key_allowed(keys, "key"));
  CHECK_FALSE(key_allowed(keys, "keyAA"));
  // The prefix-cache namespace is the key's, however it was padded.
  CHECK(cache_namespace_of("keyD ", true) == cache_namespace_of("keyD", true));
  CHECK(cache_namespace_of("keyA", true) != cache_namespace_of("keyD", true));
  CHECK(cache_namespace_of(" ", true) == 0);
}

}  // namespace troupe
