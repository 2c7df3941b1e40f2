// file_out: a file written front to back by the checkpoint and head writers, which
// remembers the first error (and how many bytes were asked for) instead of failing at each
// call; and GGUF's metadata entries written to one.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "engine/util/expected.hpp"

namespace troupe {

class file_out {
 public:
  explicit file_out(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    if (!f_) error_ = path + ": cannot create: " + std::strerror(errno);
  }
  ~file_out() {
    if (f_) std::fclose(f_);
  }
  void bytes(const void* p, size_t n) {
    if (f_ && error_.empty() && std::fwrite(p, 1, n, f_) != n)
      error_ = path_ + ": write failed: " + std::strerror(errno);
    written_ += n;
  }
  template <class T>
  void pod(const T& v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    pod(static_cast<uint64_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const char zeros[4096] = {};
    const uint64_t pad = (alignment - written_ % alignment) % alignment;
    bytes(zeros, pad);
  }
  status close() {
    if (f_ && std::fclose(f_) != 0 && error_.empty()) error_ = path_ + ": close failed: " + std::strerror(errno);
    f_ = nullptr;
    if (!error_.empty()) return error{error_};
    return ok();
  }
  uint64_t written() const { return written_; }

 private:
  std::string path_;
  FILE* f_;
  std::string error_;
  uint64_t written_ = 0;
};

// GGUF metadata entries: the key, the value's type (GGUF's numbering), the value.
inline void gguf_key(file_out& f, const std::string& key, uint32_t type) {
  f.str(key);
  f.pod(type);
}
inline void gguf_kv_string(file_out& f, const std::string& key, const std::string& v) {
  gguf_key(f, key, 8);
  f.str(v);
}
inline void gguf_kv_u32(file_out& f, const std::string& key, uint32_t v) {
  gguf_key(f, key, 4);
  f.pod(v);
}
inline void gguf_kv_f32(file_out& f, const std::string& key, float v) {
  gguf_key(f, key, 6);
  f.pod(v);
}
inline void gguf_kv_bool(file_out& f, const std::string& key, bool v) {
  gguf_key(f, key, 7);
  f.pod(static_cast<uint8_t>(v));
}

}  // namespace troupe
