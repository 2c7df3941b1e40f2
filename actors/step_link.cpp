#include "actors/step_link.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/util/tcp.hpp"

namespace troupe {

namespace {

constexpr uint32_t frame_magic = 0x4c535254;  // "TRSL" as little-endian bytes
constexpr size_t step_header = 20, answer_header = 16;
constexpr int connect_timeout_ms = 2000;
constexpr int mid_frame_timeout_s = 5;  // a peer that stops in the middle of a frame
constexpr uint32_t max_error_text = 64 * 1024;
constexpr size_t max_connections = 8;

using tcp::errno_text;
using tcp::get32;
using tcp::no_delay;
using tcp::put32;
using tcp::read_exact;
using tcp::write_all;

// A message header over the non-empty parts (at most four), in order.
template <class Parts>
msghdr gather(const Parts& parts, iovec (&iov)[4]) {
  size_t count = 0;
  for (const auto& [p, n] : parts)
    if (n > 0) iov[count++] = iovec{const_cast<void*>(static_cast<const void*>(p)), n};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = count;
  return m;
}

bool kind_ok(uint32_t k) { return k <= static_cast<uint32_t>(wire_kind::last); }

// "host:port" of a peer.
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

// `len` bytes from fd as a message of `kind`; no bytes is a message without a frame.
bool read_message(int fd, uint32_t kind, uint32_t len, wire_message& out) {
  out = wire_message{};
  out.kind = static_cast<wire_kind>(kind);
  if (len == 0) return true;
  std::vector<uint8_t> bytes(len);
  if (!read_exact(fd, bytes.data(), len)) return false;
  out = wire_message(static_cast<wire_kind>(kind), std::move(bytes));
  return true;
}

}  // namespace

// Server.

expected<std::unique_ptr<step_link_server>> step_link_server::start(const std::string& host, step_fn fn,
                                                                   tcp::port_range ports) {
  auto l = tcp::listen_in(host, ports, "step link", 4);
  if (!l) return l.err();
  std::unique_ptr<step_link_server> s(new step_link_server);
  s->fn_ = std::move(fn);
  s->listen_fd_ = l->fd;
  s->port_ = l->port;
  if (::pipe2(s->wake_, O_CLOEXEC) != 0) return error{errno_text("step link: pipe")};
  s->thread_ = std::thread([p = s.get()] { p->run(); });
  return s;
}

step_link_server::~step_link_server() {
  if (thread_.joinable()) {
    const char b = 1;
    [[maybe_unused]] const ssize_t w = ::write(wake_[1], &b, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]})
    if (fd >= 0) ::close(fd);
}

void step_link_server::run() {
  std::vector<int> conns;
  std::map<int, std::string> peers;  // each connection's address, for the log
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign({{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (int c : conns) fds.push_back({c, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents) break;
    std::vector<int> done;
    for (size_t k = 2; k < fds.size(); ++k) {
      std::string why;
      if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) && !serve_one(fds[k].fd, why)) {
        done.push_back(fds[k].fd);
        if (!why.empty())
          std::fprintf(stderr, "troupe: step link on port %u: closed the connection from %s: %s\n",
                       static_cast<unsigned>(port_), peers[fds[k].fd].c_str(), why.c_str());
      }
    }
    for (int c : done) {
      ::close(c);
      conns.erase(std::find(conns.begin(), conns.end(), c));
      peers.erase(c);
    }
    if (fds[1].revents & POLLIN) {
      sockaddr_storage from{};
      socklen_t len = sizeof from;
      const int c = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC);
      if (c >= 0) {
        if (conns.size() >= max_connections) {  // the oldest goes (a scheduler that vanished)
          ::close(conns.front());
          peers.erase(conns.front());
          conns.erase(conns.begin());
        }
        no_delay(c);
        tcp::set_timeouts(c, mid_frame_timeout_s);
        conns.push_back(c);
        peers[c] = address_text(from);
      }
    }
  }
  for (int c : conns) ::close(c);
}

bool step_link_server::serve_one(int fd, std::string& why) {
  uint8_t h[step_header];
  if (!read_exact(fd, h, sizeof h)) return false;
  if (get32(h) != frame_magic) {
    why = "not a step link frame";
    return false;
  }
  const uint32_t plan_kind = get32(h + 4), plan_len = get32(h + 8), act_kind = get32(h + 12), act_len = get32(h + 16);
  if (!kind_ok(plan_kind) || !kind_ok(act_kind)) {
    why = "a message of unknown kind";
    return false;
  }
  if (plan_len > wire_message::max_frame_bytes || act_len > wire_message::max_frame_bytes) {
    why = "a frame of " + std::to_string(std::max(plan_len, act_len)) + " bytes, past the limit of " +
          std::to_string(wire_message::max_frame_bytes);
    return false;
  }
  wire_message plan, act;
  if (!read_message(fd, plan_kind, plan_len, plan) || !read_message(fd, act_kind, act_len, act)) return false;
  const expected<wire_message> out = [&]() -> expected<wire_message> {
    try {
      return fn_(plan, act);
    } catch (const std::exception& e) {  // the step's failure, not the link's
      return error{std::string("the step failed: ") + e.what()};
    }
  }();
  uint8_t a[answer_header];
  put32(a, frame_magic);
  if (!out) {
    const std::string& why = out.err().message;
    const auto n = static_cast<uint32_t>(std::min<size_t>(why.size(), max_error_text));
    put32(a + 4, 1);
    put32(a + 8, 0);
    put32(a + 12, n);
    return write_all(fd, {{a, sizeof a}, {why.data(), n}});
  }
  put32(a + 4, 0);
  put32(a + 8, static_cast<uint32_t>(out->kind));
  put32(a + 12, static_cast<uint32_t>(out->size()));
  return write_all(fd, {{a, sizeof a}, {out->bytes ? out->bytes->data() : nullptr, out->size()}});
}

// Client.

expected<std::unique_ptr<step_link_client>> step_link_client::connect(const std::string& host, uint16_t port,
                                                                      answer_fn on_answer, broken_fn on_broken) {
  auto fd = tcp::connect_to(host, port, connect_timeout_ms, "step link");
  if (!fd) return fd.err();
  std::unique_ptr<step_link_client> c(new step_link_client);
  c->fd_ = *fd;
  c->on_answer_ = std::move(on_answer);
  c->on_broken_ = std::move(on_broken);
  c->reader_ = std::thread([p = c.get()] { p->read_answers(); });
  c->writer_ = std::thread([p = c.get()] { p->write_backlog(); });
  return c;
}

step_link_client::~step_link_client() {
  closing_ = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_writer_.notify_all();
  }
  ::shutdown(fd_, SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
  ::close(fd_);
}

void step_link_client::report(const std::string& why) {
  if (!closing_ && !reported_.exchange(true)) on_broken_(why);
}

status step_link_client::send(const wire_message& plan, const wire_message& act) {
  uint8_t h[step_header];
  put32(h, frame_magic);
  put32(h + 4, static_cast<uint32_t>(plan.kind));
  put32(h + 8, static_cast<uint32_t>(plan.size()));
  put32(h + 12, static_cast<uint32_t>(act.kind));
  put32(h + 16, static_cast<uint32_t>(act.size()));
  const std::pair<const uint8_t*, size_t> parts[] = {{h, sizeof h},
                                                     {plan.bytes ? plan.bytes->data() : nullptr, plan.size()},
                                                     {act.bytes ? act.bytes->data() : nullptr, act.size()}};
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failed_.empty()) return error{"step link: " + failed_};
  size_t taken = 0;  // bytes of the frame the socket took
  if (backlog_.empty()) {
    iovec iov[4];
    msghdr m = gather(parts, iov);
    for (;;) {
      const ssize_t w = ::sendmsg(fd_, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return error{errno_text("step link: send")};
      if (w > 0) taken += static_cast<size_t>(w);
      break;
    }
    size_t total = 0;
    for (const auto& [p, n] : parts) total += n;
    if (taken == total) return ok_t{};
  }
  // The rest, in order behind what waits already.
  std::vector<uint8_t> rest;
  size_t skip = taken;
  for (const auto& [p, n] : parts) {
    const size_t from = std::min(skip, n);
    skip -= from;
    rest.insert(rest.end(), p + from, p + n);
  }
  backlog_.push_back(std::move(rest));
  wake_writer_.notify_all();
  return ok_t{};
}

void step_link_client::write_backlog() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_writer_.wait(lock, [&] { return closing_ || !backlog_.empty(); });
    if (closing_) return;
    const std::vector<uint8_t>& front = backlog_.front();  // stays queued while it goes out
    lock.unlock();
    const bool sent = write_all(fd_, {{front.data(), front.size()}});
    lock.lock();
    if (!sent) {
      failed_ = errno_text("send");
      lock.unlock();
      report("the step link broke: " + failed_);
      return;
    }
    backlog_.pop_front();
  }
}

void step_link_client::read_answers() {
  std::string why = "the stage closed the step link";
  for (;;) {
    uint8_t h[answer_header];
    if (!read_exact(fd_, h, sizeof h)) break;
    const uint32_t st = get32(h + 4), kind = get32(h + 8), len = get32(h + 12);
    if (get32(h) != frame_magic || st > 1 || !kind_ok(kind) || len > wire_message::max_frame_bytes ||
        (st == 1 && len > max_error_text)) {
      why = "the step link carried a malformed answer";
      break;
    }
    wire_message m;
    if (!read_message(fd_, kind, len, m)) break;
    if (st == 0) {
      on_answer_(std::move(m));
    } else {
      on_answer_(error{m.bytes ? std::string(m.bytes->begin(), m.bytes->end()) : std::string("the step failed")});
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);  // later sends are refused at once
    if (failed_.empty()) failed_ = why;
  }
  report(why);
}

}  // namespace troupe
