#include "engine/util/tcp.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace troupe::tcp {

namespace {

expected<addrinfo*> resolve(const std::string& host, uint16_t port, bool passive, const std::string& who) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res) return error{who + ": " + host + ": " + ::gai_strerror(rc)};
  return res;
}

}  // namespace

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string address_text(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    port = ntohs(v6->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

void no_delay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void set_timeouts(int fd, int seconds) {
  const timeval tv{seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

namespace {

// listen_on, telling a port in use (*in_use) from every other failure.
expected<listener> listen_one(const std::string& host, uint16_t port, const std::string& who, int backlog,
                              bool* in_use) {
  *in_use = false;
  auto addrs = resolve(host, port, true, who);
  if (!addrs) return addrs.err();
  listener l;
  std::string last = "no address";
  for (addrinfo* a = *addrs; a && l.fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = errno_text("socket");
      continue;
    }
    const int one = 1;
    if (port != 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
      *in_use = errno == EADDRINUSE;
      last = errno_text("bind " + host + ":" + std::to_string(port));
      ::close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    l.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    l.fd = fd;
  }
  ::freeaddrinfo(*addrs);
  if (l.fd < 0) return error{who + ": cannot listen on " + host + ": " + last};
  return l;
}

}  // namespace

expected<listener> listen_on(const std::string& host, uint16_t port, const std::string& who, int backlog) {
  bool in_use = false;
  return listen_one(host, port, who, backlog, &in_use);
}

std::string port_range::str() const {
  if (any()) return "any port";
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

expected<listener> listen_in(const std::string& host, port_range range, const std::string& who, int backlog) {
  if (range.any()) return listen_on(host, 0, who, backlog);
  for (uint32_t p = range.first; p <= range.last; ++p) {
    bool in_use = false;
    auto l = listen_one(host, static_cast<uint16_t>(p), who, backlog, &in_use);
    if (l || !in_use) return l;
  }
  return error{who + ": every port of " + range.str() + " on " + host + " is in use"};
}

expected<int> connect_to(const std::string& host, uint16_t port, int timeout_ms, const std::string& who) {
  auto addrs = resolve(host, port, false, who);
  if (!addrs) return addrs.err();
  int fd = -1;
  std::string last = "no address";
  for (addrinfo* a = *addrs; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last = errno_text("socket");
      continue;
    }
    bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!ok && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      ok = ::poll(&p, 1, timeout_ms) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
      if (!ok) errno = err != 0 ? err : ETIMEDOUT;
    }
    if (!ok) {
      last = errno_text("connect to " + host + ":" + std::to_string(port));
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(*addrs);
  if (fd < 0) return error{who + ": " + last};
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  no_delay(fd);
  return fd;
}

bool read_exact(int fd, void* buf, size_t n) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      return false;  // closed, broken, or timed out
    }
  }
  return true;
}

bool write_all(int fd, std::initializer_list<std::pair<const void*, size_t>> parts) {
  iovec iov[4];
  size_t count = 0;
  for (const auto& [p, n] : parts)
    if (n > 0 && count < 4) iov[count++] = iovec{const_cast<void*>(p), n};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = count;
  while (m.msg_iovlen > 0) {
    const ssize_t w = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    auto left = static_cast<size_t>(w);
    while (left > 0) {
      if (left >= m.msg_iov[0].iov_len) {
        left -= m.msg_iov[0].iov_len;
        ++m.msg_iov;
        --m.msg_iovlen;
      } else {
        m.msg_iov[0].iov_base = static_cast<char*>(m.msg_iov[0].iov_base) + left;
        m.msg_iov[0].iov_len -= left;
        left = 0;
      }
    }
  }
  return true;
}

}  // namespace troupe::tcp
