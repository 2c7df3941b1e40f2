#include "engine/util/link_stream.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "engine/util/frame_assembler.hpp"
#include "engine/util/newcomers.hpp"
#include "engine/util/rate_limited_log.hpp"
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
  ptrdiff_t read_some(void* buf, size_t n) override {
    for (;;) {
      const ssize_t r = ::recv(fd(), buf, n, MSG_DONTWAIT);
      if (r > 0) return r;
      if (r == 0) return -1;
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
  }
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
  static rate_limited_log log;  // one budget for every listener of the process
  log(line);
}

std::shared_ptr<const link_guard> process_link_guard() {
  std::lock_guard<std::mutex> lock(guard_mutex);
  return guard;
}

bool wait_readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r > 0;
  }
}

frame_read read_frame(link_stream& s, frame_assembler& f, const frame_deadline& limit,
                      std::chrono::steady_clock::time_point begun, std::string& why) {
  while (!f.whole()) {
    const ptrdiff_t r = s.read_some(f.space(), f.wanted());
    if (r < 0) return frame_read::closed;
    if (r > 0) {
      if (const status taken = f.took(static_cast<size_t>(r)); !taken) {
        why = taken.err().message;
        return frame_read::refused;
      }
      continue;
    }
    const auto deadline = begun + limit.for_bytes(f.frame_bytes());
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return frame_read::late;
    pollfd p{s.fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 60'000))) < 0 && errno != EINTR)
      return frame_read::closed;
  }
  return frame_read::whole;
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
