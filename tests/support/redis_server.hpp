// redis_server: a redis-server process for a test, on a free port of 127.0.0.1, with no
// persistence, killed when the object goes. skip_reason() says why there is none (no
// redis-server on the PATH, or it did not answer within 5 s).
#pragma once

#include <string>

#include <sys/types.h>

namespace troupe::test {

class redis_server {
 public:
  // maxmemory_bytes > 0: the server refuses writes past it (a full store).
  explicit redis_server(long long maxmemory_bytes = 0);
  ~redis_server();
  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;

  bool running() const { return pid_ > 0; }
  const std::string& skip_reason() const { return why_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

  void kill();     // SIGKILL, and waits for it
  bool restart();  // a fresh server on the same port (empty: nothing persisted)

 private:
  bool start();

  int port_ = 0;
  long long maxmemory_ = 0;
  pid_t pid_ = -1;
  std::string why_;
};

}  // namespace troupe::test
