#include "tests/support/byte_relay.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "tests/support/eventually.hpp"

namespace troupe::test {

namespace {

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

int connect_loopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const sockaddr_in a = loopback(port);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

byte_relay::byte_relay(uint16_t target) : target_(target) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = loopback(0);
  socklen_t len = sizeof a;
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listen_fd_, 8) != 0 || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      ::pipe2(wake_, O_CLOEXEC) != 0)
    throw std::runtime_error("byte_relay: cannot listen on 127.0.0.1");
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { run(); });
}

byte_relay::~byte_relay() {
  const char b = 1;
  [[maybe_unused]] const ssize_t w = ::write(wake_[1], &b, 1);
  thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) ::close(fd);
}

std::string byte_relay::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

void byte_relay::run() {
  std::vector<std::pair<int, int>> pairs;  // (accepted, to the target)
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign({{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (const auto& [a, b] : pairs) {
      fds.push_back({a, POLLIN, 0});
      fds.push_back({b, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents) break;
    std::vector<size_t> done;
    for (size_t k = 0; k < pairs.size(); ++k) {
      for (int side = 0; side < 2; ++side) {
        if (!(fds[2 + 2 * k + side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const int from = side == 0 ? pairs[k].first : pairs[k].second;
        const int to = side == 0 ? pairs[k].second : pairs[k].first;
        char buf[65536];
        const ssize_t r = ::recv(from, buf, sizeof buf, 0);
        if (r > 0) {
          {
            std::lock_guard<std::mutex> lock(mutex_);
            bytes_.append(buf, static_cast<size_t>(r));
          }
          if (send_all(to, buf, static_cast<size_t>(r))) continue;
        } else if (r < 0 && errno == EINTR) {
          continue;
        }
        if (done.empty() || done.back() != k) done.push_back(k);
      }
    }
    for (auto k = done.rbegin(); k != done.rend(); ++k) {
      ::close(pairs[*k].first);
      ::close(pairs[*k].second);
      pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(*k));
    }
    if (fds[1].revents & POLLIN) {
      const int a = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (a < 0) continue;
      const int b = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in t = loopback(target_);
      if (b < 0 || ::connect(b, reinterpret_cast<sockaddr*>(&t), sizeof t) != 0) {
        ::close(a);
        if (b >= 0) ::close(b);
        continue;
      }
      pairs.emplace_back(a, b);
    }
  }
  for (const auto& [a, b] : pairs) {
    ::close(a);
    ::close(b);
  }
}

stderr_capture::stderr_capture() {
  char name[] = "/tmp/troupe-stderr-XXXXXX";
  const int fd = ::mkstemp(name);
  if (fd < 0) throw std::runtime_error("stderr_capture: no temporary file");
  path_ = name;
  std::fflush(stderr);
  saved_ = ::dup(2);
  ::dup2(fd, 2);
  ::close(fd);
}

stderr_capture::~stderr_capture() {
  std::fflush(stderr);
  ::dup2(saved_, 2);
  ::close(saved_);
  ::unlink(path_.c_str());
}

std::string stderr_capture::text() const {
  std::fflush(stderr);
  std::ifstream in(path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool stderr_capture::wait_for(std::string_view needle, int seconds) const {
  return wait_for_count(needle, 1, seconds);
}

bool stderr_capture::wait_for_count(std::string_view needle, size_t times, int seconds) const {
  return eventually(
      [&] {
        const std::string t = text();
        size_t seen = 0;
        for (size_t at = t.find(needle); at != std::string::npos && seen < times; at = t.find(needle, at + needle.size()))
          ++seen;
        return seen >= times;
      },
      std::chrono::seconds(seconds));
}

}  // namespace troupe::test
