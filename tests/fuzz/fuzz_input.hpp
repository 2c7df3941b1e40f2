// What the fuzz targets share: a libFuzzer input read as a selector byte (which decoder or
// parser gets the rest) and the bytes after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace troupe::fuzz {

struct input {
  uint8_t selector = 0;
  std::span<const uint8_t> rest;

  std::string_view text() const { return {reinterpret_cast<const char*>(rest.data()), rest.size()}; }
};

// The first byte picks one of `choices`; an empty input picks nothing (false).
inline bool split(const uint8_t* data, size_t size, uint8_t choices, input& in) {
  if (size == 0) return false;
  in.selector = static_cast<uint8_t>(data[0] % choices);
  in.rest = {data + 1, size - 1};
  return true;
}

}  // namespace troupe::fuzz
