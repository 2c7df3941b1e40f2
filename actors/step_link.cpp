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

// `len` bytes from s as a message of `kind`; no bytes is a message without a frame.
bool read_message(link_stream& s, uint32_t kind, uint32_t len, wire_message& out) {
  out = wire_message{};
  out.kind = static_cast<wire_kind>(kind);
  if (len == 0) return true;
  std::vector<uint8_t> bytes(len);
  if (!s.read_exact(bytes.data(), len)) return false;
  out = wire_message(static_cast<wire_kind>(kind), std::move(bytes));
  return true;
}

constexpr size_t max_handshakes = 8;  // newcomers in their handshake at once; more are closed

}  // namespace

// Server.

expected<std::unique_ptr<step_link_server>> step_link_server::start(const std::string& host, step_fn fn,
                                                                   tcp::port_range ports,
                                                                   std::shared_ptr<const link_guard> guard) {
  auto l = tcp::listen_in(host, ports, "step link", 4);
  if (!l) return l.err();
  std::unique_ptr<step_link_server> s(new step_link_server);
  s->fn_ = std::move(fn);
  s->guard_ = std::move(guard);
  s->listen_fd_ = l->fd;
  s->port_ = l->port;
  if (::pipe2(s->wake_, O_CLOEXEC | O_NONBLOCK) != 0) return error{errno_text("step link: pipe")};
  s->thread_ = std::thread([p = s.get()] { p->run(); });
  return s;
}

step_link_server::~step_link_server() {
  if (thread_.joinable()) {
    stopping_ = true;
    wake();
    thread_.join();
  }
  for (handshake& h : handshakes_) ::shutdown(h.fd, SHUT_RDWR);
  for (handshake& h : handshakes_) {
    h.thread.join();
    ::close(h.fd);
  }
  conns_.clear();
  ready_.clear();
  for (int fd : {listen_fd_, wake_[0], wake_[1]})
    if (fd >= 0) ::close(fd);
}

void step_link_server::wake() {
  const char b = 1;
  [[maybe_unused]] const ssize_t w = ::write(wake_[1], &b, 1);
}

void step_link_server::run() {
  std::vector<pollfd> fds;
  for (;;) {
    // A secured connection may hold a step already decrypted, which poll cannot see.
    const bool buffered = std::any_of(conns_.begin(), conns_.end(), [](const connection& c) { return c.stream->buffered(); });
    fds.assign({{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (const connection& c : conns_) fds.push_back({c.stream->fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), buffered ? 0 : -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents) {
      char drain[64];
      while (::read(wake_[0], drain, sizeof drain) > 0) {
      }
      if (stopping_) break;
    }
    std::vector<size_t> done;
    for (size_t k = 0; k < conns_.size(); ++k) {
      std::string why;
      if (((fds[k + 2].revents & (POLLIN | POLLHUP | POLLERR)) || conns_[k].stream->buffered()) &&
          !serve_one(*conns_[k].stream, why)) {
        done.push_back(k);
        if (!why.empty())
          std::fprintf(stderr, "troupe: step link on port %u: closed the connection from %s: %s\n",
                       static_cast<unsigned>(port_), conns_[k].peer.c_str(), why.c_str());
      }
    }
    for (auto k = done.rbegin(); k != done.rend(); ++k) conns_.erase(conns_.begin() + static_cast<ptrdiff_t>(*k));
    // Newcomers whose handshakes are done, then the handshakes' threads.
    std::vector<connection> ready;
    {
      std::lock_guard<std::mutex> lock(ready_mutex_);
      ready.swap(ready_);
    }
    for (connection& c : ready) {
      if (conns_.size() >= max_connections) conns_.erase(conns_.begin());  // the oldest goes (a scheduler that vanished)
      conns_.push_back(std::move(c));
    }
    for (auto it = handshakes_.begin(); it != handshakes_.end();) {
      if (!it->done->load()) {
        ++it;
        continue;
      }
      it->thread.join();
      ::close(it->fd);
      it = handshakes_.erase(it);
    }
    if (fds[1].revents & POLLIN) accept_one();
  }
  conns_.clear();
}

void step_link_server::accept_one() {
  sockaddr_storage from{};
  socklen_t len = sizeof from;
  const int c = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC);
  if (c < 0) return;
  no_delay(c);
  std::string peer = tcp::address_text(from);
  if (!guard_) {
    if (conns_.size() >= max_connections) conns_.erase(conns_.begin());  // the oldest goes
    conns_.push_back({plain_stream(c), std::move(peer)});
    conns_.back().stream->set_timeout(mid_frame_timeout_s);
    return;
  }
  const std::string where = "troupe: step link on port " + std::to_string(port_) + ": ";
  if (handshakes_.size() >= max_handshakes) {
    ::close(c);
    log_link_refusal(where + peer + ": refused: " + std::to_string(max_handshakes) + " connections in their handshake already");
    return;
  }
  const int mine = ::fcntl(c, F_DUPFD_CLOEXEC, 0);
  if (mine < 0) {
    ::close(c);
    return;
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  handshakes_.push_back({c, std::thread([this, mine, peer, where, done] {
                           auto s = guard_->server(mine, link_handshake_ms);
                           if (s) {
                             (*s)->set_timeout(mid_frame_timeout_s);
                             std::lock_guard<std::mutex> lock(ready_mutex_);
                             ready_.push_back({std::move(s).value(), peer});
                           } else {
                             log_link_refusal(where + peer + ": refused: " + s.err().message);
                           }
                           done->store(true);
                           wake();
                         }),
                         done});
}

bool step_link_server::serve_one(link_stream& s, std::string& why) {
  uint8_t h[step_header];
  if (!s.read_exact(h, sizeof h)) return false;
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
  if (!read_message(s, plan_kind, plan_len, plan) || !read_message(s, act_kind, act_len, act)) return false;
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
    return s.write_all({{a, sizeof a}, {why.data(), n}});
  }
  put32(a + 4, 0);
  put32(a + 8, static_cast<uint32_t>(out->kind));
  put32(a + 12, static_cast<uint32_t>(out->size()));
  return s.write_all({{a, sizeof a}, {out->bytes ? out->bytes->data() : nullptr, out->size()}});
}

// Client.

expected<std::unique_ptr<step_link_client>> step_link_client::connect(const std::string& host, uint16_t port,
                                                                      answer_fn on_answer, broken_fn on_broken,
                                                                      std::shared_ptr<const link_guard> guard) {
  auto fd = tcp::connect_to(host, port, connect_timeout_ms, "step link");
  if (!fd) return fd.err();
  auto stream = open_client_stream(guard.get(), *fd, link_handshake_ms);
  if (!stream) return error{"step link to " + host + ":" + std::to_string(port) + ": " + stream.err().message};
  std::unique_ptr<step_link_client> c(new step_link_client);
  c->stream_ = std::move(stream).value();
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
  stream_->shutdown();
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
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
  if (backlog_.empty() && !stream_->secured()) {  // a secured frame goes out through the writer
    const int fd = stream_->fd();
    iovec iov[4];
    msghdr m = gather(parts, iov);
    for (;;) {
      const ssize_t w = ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
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
    const bool sent = stream_->write_all({{front.data(), front.size()}});
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
    if (!stream_->read_exact(h, sizeof h)) break;
    const uint32_t st = get32(h + 4), kind = get32(h + 8), len = get32(h + 12);
    if (get32(h) != frame_magic || st > 1 || !kind_ok(kind) || len > wire_message::max_frame_bytes ||
        (st == 1 && len > max_error_text)) {
      why = "the step link carried a malformed answer";
      break;
    }
    wire_message m;
    if (!read_message(*stream_, kind, len, m)) break;
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
