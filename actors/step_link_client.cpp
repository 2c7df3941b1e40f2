// The step link's client, the scheduler's end (actors/step_link.hpp).
#include "actors/step_link.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "actors/step_link_frames.hpp"
#include "engine/util/tcp.hpp"

namespace troupe {

namespace {

using namespace step_frames;
using tcp::errno_text;
using tcp::get32;
using tcp::put32;

constexpr int connect_timeout_ms = 2000;

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

}  // namespace

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
