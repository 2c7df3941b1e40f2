// mapped_file: a whole file mapped read-only into memory, for weights that are used in
// place. Movable, not copyable; the mapping lives as long as the object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/util/expected.hpp"

namespace troupe {

class mapped_file {
 public:
  static expected<mapped_file> open(const std::string& path);

  mapped_file() = default;
  mapped_file(mapped_file&& o) noexcept;
  mapped_file& operator=(mapped_file&& o) noexcept;
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace troupe
