// tcp: the few blocking-socket steps troupe's own links share (step links, the KV
// channel): listening, connecting with a time limit, whole reads and gathered writes.
// Each function returns false or an error with the system's reason; none throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include <sys/socket.h>

#include "engine/util/expected.hpp"

namespace troupe::tcp {

// "what: <strerror(errno)>".
std::string errno_text(const std::string& what);

struct listener {
  int fd = -1;
  uint16_t port = 0;  // the one bound (port 0 asks for any free one)
};
// A listening socket on host:port (close-on-exec), `who` naming it in errors.
expected<listener> listen_on(const std::string& host, uint16_t port, const std::string& who, int backlog = 8);

// Ports a listener may take (a firewall's opening): first..last, inclusive; 0 and 0, any
// free port the system gives.
struct port_range {
  uint16_t first = 0, last = 0;
  bool any() const { return first == 0; }
  std::string str() const;  // "20000-20099", "20000", "any port"
};
// A listening socket on the first free port of `range`; an error naming the range when
// every port of it is taken (or the reason, for any other failure).
expected<listener> listen_in(const std::string& host, port_range range, const std::string& who, int backlog = 8);
// A connected socket (blocking, TCP_NODELAY), or why not within timeout_ms.
expected<int> connect_to(const std::string& host, uint16_t port, int timeout_ms, const std::string& who);

// "host:port" of an address (a peer accept() reported).
std::string address_text(const sockaddr_storage& a);

void no_delay(int fd);
// SO_RCVTIMEO and SO_SNDTIMEO: a read or write that stalls this long fails.
void set_timeouts(int fd, int seconds);

// Reads exactly n bytes; false on close, error or timeout.
bool read_exact(int fd, void* buf, size_t n);
// Writes every part in order (empty parts skipped; at most four), MSG_NOSIGNAL.
bool write_all(int fd, std::initializer_list<std::pair<const void*, size_t>> parts);

inline void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}
inline void put64(uint8_t* p, uint64_t v) {
  put32(p, static_cast<uint32_t>(v));
  put32(p + 4, static_cast<uint32_t>(v >> 32));
}
inline uint64_t get64(const uint8_t* p) { return uint64_t{get32(p)} | uint64_t{get32(p + 4)} << 32; }

}  // namespace troupe::tcp
