// link_stream: one connection of troupe's own links between nodes (step links, the KV
// channel), plain TCP or secured, behind one interface: whole reads, gathered writes, a
// stall timeout. One thread may read while another writes.
//
// How a process secures its links is a link_guard: none (plain TCP), or TLS with the
// node's certificate (actors/tls/tls_links.hpp). A node sets its guard once, before its
// links open (set_process_link_guard); the links take the process's guard unless given
// their own (tests do).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "engine/util/expected.hpp"

namespace troupe {

// How long a peer has to complete its handshake on a secured link.
constexpr int link_handshake_ms = 5000;

// Why a handshake ended when the peer closed the connection before it was done: a peer
// that gave up (its own time limit, its process ending), not one refused.
inline constexpr const char* closed_in_handshake = "it closed the connection during the TLS handshake";
// What a failed handshake's log line says: "refused: WHY", or WHY alone where the peer left.
inline std::string handshake_outcome(const std::string& why) {
  return why.find(closed_in_handshake) != std::string::npos ? why : "refused: " + why;
}

class link_stream {
 public:
  explicit link_stream(int fd) : fd_(fd) {}
  virtual ~link_stream();  // closes the socket
  link_stream(const link_stream&) = delete;
  link_stream& operator=(const link_stream&) = delete;

  int fd() const { return fd_; }
  // A read or write that stalls this long fails (0: never).
  virtual void set_timeout(int seconds) = 0;
  // Reads exactly n bytes; false on close, error or timeout.
  virtual bool read_exact(void* buf, size_t n) = 0;
  // Reads what has arrived, at most n bytes, without waiting: how many (> 0); 0 when none
  // has yet (poll fd() for more, unless buffered()); -1 when the connection is over
  // (closed, broken, or its peer broke the secured protocol).
  virtual ptrdiff_t read_some(void* buf, size_t n) = 0;
  // Writes every part in order (empty parts skipped; at most four).
  virtual bool write_all(std::initializer_list<std::pair<const void*, size_t>> parts) = 0;
  // Bytes received and ready to read that a poll on fd() would not show (a secured
  // stream's decrypted remainder).
  virtual bool buffered() const { return false; }
  // Encrypted and authenticated (false: plain TCP, whose fd may be written directly).
  virtual bool secured() const { return false; }
  // Ends the connection for both directions: a blocked read or write returns false.
  void shutdown();

 private:
  int fd_;
};

// A plain TCP stream over fd (owned from now on).
std::unique_ptr<link_stream> plain_stream(int fd);

class link_guard {
 public:
  virtual ~link_guard() = default;
  // What it does, for logs: "TLS 1.3".
  virtual std::string name() const = 0;
  // A stream over a connected socket (owned from now on, closed on failure), once the
  // peer has proved itself within timeout_ms; the error says why not (the caller names
  // the peer).
  virtual expected<std::unique_ptr<link_stream>> client(int fd, int timeout_ms) const = 0;
  virtual expected<std::unique_ptr<link_stream>> server(int fd, int timeout_ms) const = 0;
};

// The process's guard: null (plain TCP) until set.
void set_process_link_guard(std::shared_ptr<const link_guard> g);
std::shared_ptr<const link_guard> process_link_guard();

// A refused peer's line in the node's log (stderr): every one, up to 20 lines in 10 s;
// past that, how many more there were, once the 10 s are over (a flood of strangers
// cannot fill the log).
void log_link_refusal(const std::string& line);

class frame_assembler;
struct frame_deadline;

// How read_frame ended.
enum class frame_read {
  whole,    // the frame is whole
  closed,   // the connection ended
  late,     // the frame was not whole by its deadline
  refused,  // its header was refused (`why` says why)
};
// Reads the rest of the frame `f` holds (or a whole one) from s, within `limit` of
// `begun` for a frame of its length (known once its header is).
frame_read read_frame(link_stream& s, frame_assembler& f, const frame_deadline& limit,
                      std::chrono::steady_clock::time_point begun, std::string& why);

// The stream for a new connection: through `guard`, or plain without one.
expected<std::unique_ptr<link_stream>> open_client_stream(const link_guard* guard, int fd, int timeout_ms);
expected<std::unique_ptr<link_stream>> open_server_stream(const link_guard* guard, int fd, int timeout_ms);

}  // namespace troupe
