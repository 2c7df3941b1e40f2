#include "tests/support/redis_server.hpp"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/eventually.hpp"

namespace troupe::test {

namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

bool answers(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (ok) {
    const char ping[] = "PING\r\n";
    char buf[16] = {};
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ok = ::write(fd, ping, sizeof ping - 1) == sizeof ping - 1 && ::read(fd, buf, sizeof buf - 1) > 0 && buf[0] == '+';
  }
  ::close(fd);
  return ok;
}

}  // namespace

redis_server::redis_server(long long maxmemory_bytes) : maxmemory_(maxmemory_bytes) {
  if (std::system("command -v redis-server >/dev/null 2>&1") != 0) {
    why_ = "redis-server is not installed (tools/install-packages.sh installs it)";
    return;
  }
  port_ = free_port();
  start();
}

redis_server::~redis_server() { kill(); }

bool redis_server::start() {
  const std::string port = std::to_string(port_);
  const std::string maxmemory = std::to_string(maxmemory_);
  pid_ = ::fork();
  if (pid_ == 0) {
    const int devnull = ::open("/dev/null", O_RDWR);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    if (maxmemory_ > 0)
      ::execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--maxmemory", maxmemory.c_str(), "--maxmemory-policy", "noeviction",
               static_cast<char*>(nullptr));
    else
      ::execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  bool exited = false;
  if (eventually(
          [&] {
            int status = 0;
            exited = ::waitpid(pid_, &status, WNOHANG) == pid_;
            return exited || answers(port_);
          },
          std::chrono::seconds(5)) &&
      !exited)
    return true;
  why_ = "redis-server did not answer on port " + port;
  kill();
  return false;
}

void redis_server::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

bool redis_server::restart() {
  kill();
  why_.clear();
  return start();
}

}  // namespace troupe::test
