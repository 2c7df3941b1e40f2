// mapped_file: a whole file mapped read-only into memory, for weights that are used in
// place. Movable, not copyable; the mapping lives as long as the object. A file's bytes
// may also be held in memory (copy_of): the fuzz targets hand the loaders inputs that way,
// in an allocation of exactly their size, so a read past the end is AddressSanitizer's to
// find rather than the page's slack to hide.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "engine/util/expected.hpp"

namespace troupe {

class mapped_file {
 public:
  static expected<mapped_file> open(const std::string& path);
  // The bytes, copied, under the name `path` (which error messages give).
  static mapped_file copy_of(std::span<const uint8_t> bytes, std::string path);

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
  void release();

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  std::unique_ptr<uint8_t[]> owned_;  // copy_of's bytes; otherwise data_ is a mapping
};

}  // namespace troupe
