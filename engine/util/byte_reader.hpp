// byte_reader: a bounds-checked little-endian cursor over bytes read from outside (a
// checkpoint, a vocabulary). Every read checks the remaining length first; the first
// failure is kept, later reads fail too, and the error names the file, the offset and
// what was being read.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace troupe {

class byte_reader {
 public:
  byte_reader(const uint8_t* data, size_t size, std::string name)
      : data_(data), size_(size), name_(std::move(name)) {}

  template <class T>
  bool read(T& out, std::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (!need(sizeof(T), what)) return false;
    std::memcpy(&out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  // Points at n bytes in place and advances past them.
  bool bytes(size_t n, const uint8_t*& out, std::string_view what) {
    if (!need(n, what)) return false;
    out = data_ + pos_;
    pos_ += n;
    return true;
  }

  bool skip(size_t n, std::string_view what) {
    const uint8_t* unused;
    return bytes(n, unused, what);
  }

  bool seek(size_t pos, std::string_view what) {
    if (failed_) return false;
    if (pos > size_) return fail(what, "offset " + std::to_string(pos) + " is past the end (" +
                                           std::to_string(size_) + " bytes)");
    pos_ = pos;
    return true;
  }

  bool fail(std::string_view what, const std::string& problem) {
    if (!failed_) {
      failed_ = true;
      error_ = name_ + ": " + std::string(what) + ": " + problem;
    }
    return false;
  }

  size_t pos() const { return pos_; }
  size_t size() const { return size_; }
  size_t remaining() const { return size_ - pos_; }
  bool failed() const { return failed_; }
  const std::string& error_message() const { return error_; }
  const std::string& name() const { return name_; }

 private:
  bool need(size_t n, std::string_view what) {
    if (failed_) return false;
    if (n > size_ - pos_)
      return fail(what, "truncated: needs " + std::to_string(n) + " bytes at offset " +
                            std::to_string(pos_) + ", file has " + std::to_string(size_));
    return true;
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string name_;
  bool failed_ = false;
  std::string error_;
};

}  // namespace troupe
