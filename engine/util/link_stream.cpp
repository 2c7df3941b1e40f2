#include "engine/util/link_stream.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>

#include "engine/util/tcp.hpp"

namespace troupe {

link_stream::~link_stream() {
  if (fd_ >= 0) ::close(fd_);
}

void link_stream::shutdown() { ::shutdown(fd_, SHUT_RDWR); }

namespace {

class plain : public link_stream {
 public:
  using link_stream::link_stream;
  void set_timeout(int seconds) override { tcp::set_timeouts(fd(), seconds); }
  bool read_exact(void* buf, size_t n) override { return tcp::read_exact(fd(), buf, n); }
  bool write_all(std::initializer_list<std::pair<const void*, size_t>> parts) override {
    return tcp::write_all(fd(), parts);
  }
};

std::mutex guard_mutex;
std::shared_ptr<const link_guard> guard;

}  // namespace

std::unique_ptr<link_stream> plain_stream(int fd) { return std::make_unique<plain>(fd); }

void set_process_link_guard(std::shared_ptr<const link_guard> g) {
  std::lock_guard<std::mutex> lock(guard_mutex);
  guard = std::move(g);
}

void log_link_refusal(const std::string& line) {
  static std::mutex mu;
  static auto window = std::chrono::steady_clock::now();
  static int lines = 0, held = 0;
  std::lock_guard<std::mutex> lock(mu);
  const auto now = std::chrono::steady_clock::now();
  if (now - window > std::chrono::seconds(10)) {
    if (held > 0) std::fprintf(stderr, "troupe: %d more connection(s) refused in 10 s, not logged one by one\n", held);
    window = now;
    lines = held = 0;
  }
  if (++lines > 20) {
    ++held;
    return;
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

std::shared_ptr<const link_guard> process_link_guard() {
  std::lock_guard<std::mutex> lock(guard_mutex);
  return guard;
}

expected<std::unique_ptr<link_stream>> open_client_stream(const link_guard* g, int fd, int timeout_ms) {
  if (!g) return plain_stream(fd);
  return g->client(fd, timeout_ms);
}

expected<std::unique_ptr<link_stream>> open_server_stream(const link_guard* g, int fd, int timeout_ms) {
  if (!g) return plain_stream(fd);
  return g->server(fd, timeout_ms);
}

}  // namespace troupe
