// The host and disk tiers (kv_tiers.hpp); Redis's is kv_tier_redis.cpp.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <unordered_map>

#include <fcntl.h>
#include <unistd.h>

#include "engine/kv/kv_tiers.hpp"

namespace troupe {

namespace {

// Records by name, least recently used first out, within a byte capacity.
class lru_bytes {
 public:
  explicit lru_bytes(uint64_t capacity) : capacity_(capacity) {}

  // Notes `name` (now `bytes` long) as just used; returns the names pushed out.
  std::vector<std::string> touch(const std::string& name, uint64_t bytes) {
    if (auto it = at_.find(name); it != at_.end()) {
      used_ -= it->second->second;
      order_.erase(it->second);
    }
    order_.emplace_back(name, bytes);
    at_[name] = std::prev(order_.end());
    used_ += bytes;
    std::vector<std::string> out;
    while (used_ > capacity_ && order_.size() > 1) {
      out.push_back(order_.front().first);
      forget(order_.front().first);
    }
    return out;
  }
  bool used(const std::string& name) {
    auto it = at_.find(name);
    if (it == at_.end()) return false;
    order_.splice(order_.end(), order_, it->second);
    return true;
  }
  void forget(const std::string& name) {
    auto it = at_.find(name);
    if (it == at_.end()) return;
    used_ -= it->second->second;
    order_.erase(it->second);
    at_.erase(it);
  }

 private:
  uint64_t capacity_, used_ = 0;
  std::list<std::pair<std::string, uint64_t>> order_;
  std::unordered_map<std::string, std::list<std::pair<std::string, uint64_t>>::iterator> at_;
};

class host_store final : public kv_tier_store {
 public:
  explicit host_store(uint64_t capacity) : lru_(capacity) {}
  tier_kind kind() const override { return tier_kind::host; }

  status put(const std::string& name, std::span<const std::byte> record) override {
    std::lock_guard lock(mu_);
    data_[name].assign(record.begin(), record.end());
    for (const std::string& out : lru_.touch(name, record.size())) data_.erase(out);
    return ok();
  }
  expected<std::optional<std::vector<std::byte>>> get(const std::string& name) override {
    std::lock_guard lock(mu_);
    auto it = data_.find(name);
    if (it == data_.end()) return std::optional<std::vector<std::byte>>{};
    lru_.used(name);
    return std::optional<std::vector<std::byte>>{it->second};
  }
  void erase(const std::string& name) override {
    std::lock_guard lock(mu_);
    data_.erase(name);
    lru_.forget(name);
  }
  expected<size_t> leading_present(std::span<const std::string> names) override {
    std::lock_guard lock(mu_);
    size_t n = 0;
    while (n < names.size() && data_.count(names[n])) ++n;
    return n;
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::vector<std::byte>> data_;
  lru_bytes lru_;
};

// One file per record, named by a hash of the record's name; written whole to a temporary
// file, then renamed, so a reader never sees half a record (a crash leaves a stray
// temporary at most, removed at the next start).
class disk_store final : public kv_tier_store {
 public:
  disk_store(std::filesystem::path dir, uint64_t capacity) : dir_(std::move(dir)), lru_(capacity) {}

  status scan() {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) return error{"disk tier: cannot make " + dir_.string() + ": " + ec.message()};
    std::vector<std::pair<fs::file_time_type, fs::path>> found;
    for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const fs::path p = it->path();
      std::error_code one;  // (a file that vanished meanwhile is skipped)
      if (p.extension() == ".tmp") {
        fs::remove(p, one);
      } else if (p.extension() == ".kvb") {
        const auto when = fs::last_write_time(p, one);
        if (!one) found.emplace_back(when, p);
      }
    }
    if (ec) return error{"disk tier: cannot read " + dir_.string() + ": " + ec.message()};
    std::sort(found.begin(), found.end());
    for (const auto& [when, p] : found) {
      std::error_code e2;
      const auto size = fs::file_size(p, e2);
      if (e2) continue;
      for (const std::string& out : lru_.touch(p.filename().string(), size)) fs::remove(dir_ / out, e2);
    }
    // Writable? (A read-only directory is an error now, not at the first write.)
    const fs::path probe = dir_ / ("probe-" + std::to_string(::getpid()) + ".tmp");
    if (!std::ofstream(probe)) return error{"disk tier: cannot write in " + dir_.string()};
    fs::remove(probe, ec);
    return ok();
  }

  tier_kind kind() const override { return tier_kind::disk; }

  status put(const std::string& name, std::span<const std::byte> record) override {
    namespace fs = std::filesystem;
    const std::string file = file_name(name);
    const fs::path tmp = dir_ / (file + "." + std::to_string(::getpid()) + "-" + std::to_string(++seq_) + ".tmp");
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return error{"disk tier: cannot write " + tmp.string() + ": " + std::strerror(errno)};
    size_t done = 0;
    while (done < record.size()) {
      const ssize_t n = ::write(fd, record.data() + done, record.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = n < 0 ? std::strerror(errno) : "nothing written";
        ::close(fd);
        ::unlink(tmp.c_str());
        return error{"disk tier: writing " + tmp.string() + ": " + why};
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    std::error_code ec;
    fs::rename(tmp, dir_ / file, ec);
    if (ec) {
      fs::remove(tmp, ec);
      return error{"disk tier: " + ec.message()};
    }
    std::lock_guard lock(mu_);
    for (const std::string& out : lru_.touch(file, record.size())) fs::remove(dir_ / out, ec);
    return ok();
  }

  expected<std::optional<std::vector<std::byte>>> get(const std::string& name) override {
    const std::string file = file_name(name);
    const int fd = ::open((dir_ / file).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::optional<std::vector<std::byte>>{};
      return error{"disk tier: reading " + file + ": " + std::strerror(errno)};
    }
    std::vector<std::byte> out;
    std::byte buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        ::close(fd);
        return error{"disk tier: reading " + file + ": " + std::strerror(errno)};
      }
      if (n == 0) break;
      out.insert(out.end(), buf, buf + n);
    }
    ::close(fd);
    std::lock_guard lock(mu_);
    lru_.used(file);
    return std::optional<std::vector<std::byte>>{std::move(out)};
  }

  expected<size_t> leading_present(std::span<const std::string> names) override {
    size_t n = 0;
    while (n < names.size() && ::access((dir_ / file_name(names[n])).c_str(), F_OK) == 0) ++n;
    return n;
  }

  void erase(const std::string& name) override {
    const std::string file = file_name(name);
    std::error_code ec;
    std::filesystem::remove(dir_ / file, ec);
    std::lock_guard lock(mu_);
    lru_.forget(file);
  }

 private:
  static std::string file_name(const std::string& name) {
    const auto bytes = std::as_bytes(std::span(name.data(), name.size()));
    return tier_key{checksum64(bytes, 1), checksum64(bytes, 2)}.hex() + ".kvb";
  }

  std::filesystem::path dir_;
  std::mutex mu_;
  lru_bytes lru_;
  std::atomic<uint64_t> seq_{0};
};

}  // namespace

std::unique_ptr<kv_tier_store> make_host_store(uint64_t capacity_bytes) {
  return std::make_unique<host_store>(capacity_bytes ? capacity_bytes : default_tier_capacity);
}

expected<std::unique_ptr<kv_tier_store>> make_disk_store(const std::string& dir, uint64_t capacity_bytes,
                                                         const std::string& scope) {
  std::filesystem::path root(dir);
  if (!scope.empty()) root /= scope;
  auto s = std::make_unique<disk_store>(root, capacity_bytes ? capacity_bytes : default_tier_capacity);
  if (auto st = s->scan(); !st) return st.err();
  return std::unique_ptr<kv_tier_store>(std::move(s));
}

expected<std::unique_ptr<kv_tier_store>> make_tier_store(const tier_config& c, const std::string& scope) {
  if (auto e = validate(c)) return error{*e};
  switch (c.kind) {
    case tier_kind::host: return make_host_store(c.capacity_bytes);
    case tier_kind::disk: return make_disk_store(c.path, c.capacity_bytes, scope);
    case tier_kind::redis: return make_redis_store(c.address, c.timeout_ms);
  }
  return error{"unknown tier kind"};
}

}  // namespace troupe
