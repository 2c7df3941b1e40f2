#include "engine/util/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace troupe {

expected<mapped_file> mapped_file::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return error{path + ": cannot open: " + std::strerror(errno)};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return error{path + ": cannot stat: " + std::strerror(e)};
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return error{path + ": not a regular file"};
  }
  mapped_file f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return error{path + ": cannot map: " + std::strerror(e)};
    }
    f.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

mapped_file mapped_file::copy_of(std::span<const uint8_t> bytes, std::string path) {
  mapped_file f;
  f.path_ = std::move(path);
  f.size_ = bytes.size();
  if (!bytes.empty()) {
    f.owned_.reset(new uint8_t[bytes.size()]);
    std::memcpy(f.owned_.get(), bytes.data(), bytes.size());
    f.data_ = f.owned_.get();
  }
  return f;
}

mapped_file::mapped_file(mapped_file&& o) noexcept
    : data_(o.data_), size_(o.size_), path_(std::move(o.path_)), owned_(std::move(o.owned_)) {
  o.data_ = nullptr;
  o.size_ = 0;
}

mapped_file& mapped_file::operator=(mapped_file&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    owned_ = std::move(o.owned_);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

mapped_file::~mapped_file() { release(); }

void mapped_file::release() {
  if (data_ != nullptr && !owned_) ::munmap(const_cast<uint8_t*>(data_), size_);
  owned_.reset();
  data_ = nullptr;
  size_ = 0;
}

}  // namespace troupe
