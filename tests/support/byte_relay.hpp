// byte_relay: a TCP relay on 127.0.0.1 for tests that check what a link carries in the
// clear. It forwards each connection it accepts to a target port and keeps a copy of every
// byte that crosses it, both ways.
//
// connect_loopback: a plain TCP connection to 127.0.0.1:port, for bytes no client sends.
//
// stderr_capture: what the process writes to stderr (any thread) while it lives, for tests
// of log lines.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace troupe::test {

// A connected socket, or -1.
int connect_loopback(uint16_t port);

class byte_relay {
 public:
  explicit byte_relay(uint16_t target);
  ~byte_relay();
  byte_relay(const byte_relay&) = delete;
  byte_relay& operator=(const byte_relay&) = delete;

  uint16_t port() const { return port_; }
  std::string bytes() const;  // everything so far, both directions
  bool saw(std::string_view needle) const { return bytes().find(needle) != std::string::npos; }

 private:
  void run();

  uint16_t target_, port_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  mutable std::mutex mutex_;
  std::string bytes_;
  std::thread thread_;
};

class stderr_capture {
 public:
  stderr_capture();
  ~stderr_capture();  // stderr is the process's own again
  stderr_capture(const stderr_capture&) = delete;
  stderr_capture& operator=(const stderr_capture&) = delete;

  std::string text() const;  // what was written so far
  // Waits (at most `seconds`) until the text holds `needle`.
  bool wait_for(std::string_view needle, int seconds = 5) const;
  // Waits (at most `seconds`) until the text holds `needle` at least `times` times.
  bool wait_for_count(std::string_view needle, size_t times, int seconds = 5) const;

 private:
  int saved_ = -1;
  std::string path_;
};

}  // namespace troupe::test
