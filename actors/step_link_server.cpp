// The step link's server: one thread reads every connection without waiting on any
// (actors/step_link.hpp).
#include "actors/step_link.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <map>
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
using tcp::no_delay;
using tcp::put32;

constexpr int answer_timeout_s = 5;  // a scheduler that takes no answer for this long is gone
constexpr size_t max_connections = 8;
constexpr size_t max_handshakes = 32;  // newcomers in their handshake at once; past it the oldest is cut short

// `bytes` as a message of `kind`; no bytes is a message without a frame.
wire_message message_of(uint32_t kind, std::span<const uint8_t> bytes) {
  if (bytes.empty()) {
    wire_message m;
    m.kind = static_cast<wire_kind>(kind);
    return m;
  }
  return wire_message(static_cast<wire_kind>(kind), std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

}  // namespace

expected<std::unique_ptr<step_link_server>> step_link_server::start(const std::string& host, step_fn fn,
                                                                   tcp::port_range ports,
                                                                   std::shared_ptr<const link_guard> guard,
                                                                   std::shared_ptr<link_meter> meter,
                                                                   frame_deadline frame_time) {
  auto l = tcp::listen_in(host, ports, "step link", 16);
  if (!l) return l.err();
  std::unique_ptr<step_link_server> s(new step_link_server);
  s->fn_ = std::move(fn);
  s->guard_ = std::move(guard);
  s->meter_ = std::move(meter);
  s->deadline_ = frame_time;
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

frame_assembler step_link_frames() {
  return frame_assembler(step_header, [](std::span<const uint8_t> h) -> expected<size_t> {
    if (get32(h.data()) != frame_magic) return error{"not a step link frame"};
    const uint32_t plan_kind = get32(h.data() + 4), plan_len = get32(h.data() + 8), act_kind = get32(h.data() + 12),
                   act_len = get32(h.data() + 16);
    if (!kind_ok(plan_kind) || !kind_ok(act_kind)) return error{"a message of unknown kind"};
    if (plan_len > wire_message::max_frame_bytes || act_len > wire_message::max_frame_bytes)
      return error{"a frame of " + std::to_string(std::max(plan_len, act_len)) + " bytes, past the limit of " +
                   std::to_string(wire_message::max_frame_bytes)};
    return size_t{plan_len} + act_len;
  });
}

step_link_server::connection step_link_server::make_connection(std::unique_ptr<link_stream> s, std::string peer) {
  s->set_timeout(answer_timeout_s);  // for writing answers; reads never wait
  return connection{std::move(s), std::move(peer), step_link_frames(), {}};
}

void step_link_server::add(connection c) {
  if (conns_.size() >= max_connections) {
    // The oldest that never stepped goes (a stranger's, or a scheduler's that vanished
    // before its first step), else the oldest (a scheduler that vanished).
    auto idle = std::find_if(conns_.begin(), conns_.end(), [](const connection& k) { return k.steps == 0; });
    conns_.erase(idle != conns_.end() ? idle : conns_.begin());
  }
  conns_.push_back(std::move(c));
}

std::optional<std::chrono::steady_clock::time_point> step_link_server::next_deadline() const {
  std::optional<std::chrono::steady_clock::time_point> first;
  for (const connection& c : conns_)
    if (c.frame.begun()) {
      const auto d = c.begun + deadline_.for_bytes(c.frame.frame_bytes());
      if (!first || d < *first) first = d;
    }
  return first;
}

void step_link_server::run() {
  std::vector<pollfd> fds;
  for (;;) {
    // A secured connection may hold a step already decrypted, which poll cannot see.
    const bool buffered = std::any_of(conns_.begin(), conns_.end(), [](const connection& c) { return c.stream->buffered(); });
    int timeout_ms = buffered ? 0 : -1;
    if (const auto d = next_deadline(); d && !buffered) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*d - std::chrono::steady_clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 60'000));
    }
    fds.assign({{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (const connection& c : conns_) fds.push_back({c.stream->fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
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
    const auto now = std::chrono::steady_clock::now();
    for (size_t k = 0; k < conns_.size(); ++k) {
      connection& c = conns_[k];
      std::string why;
      if (((fds[k + 2].revents & (POLLIN | POLLHUP | POLLERR)) || c.stream->buffered()) && !pump(c, why)) {
        done.push_back(k);
        if (!why.empty()) {
          if (meter_) meter_->refused(link_kind::step);
          refusals_("troupe: step link on port " + std::to_string(port_) + ": closed the connection from " + c.peer + ": " + why);
        }
      } else if (c.frame.begun() && now >= c.begun + deadline_.for_bytes(c.frame.frame_bytes())) {
        // A peer that stops (or trickles) in the middle of a frame: its connection goes,
        // and the next scheduler connection (or this one, again) is served as before.
        done.push_back(k);
        if (meter_) meter_->stalled(link_kind::step);
        const auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_.for_bytes(c.frame.frame_bytes()));
        refusals_("troupe: step link on port " + std::to_string(port_) + ": closed the connection from " + c.peer +
                  ": a frame of " + std::to_string(c.frame.frame_bytes()) + " bytes not whole within " +
                  std::to_string(limit.count()) + " ms (a stalled link)");
      }
    }
    for (auto k = done.rbegin(); k != done.rend(); ++k) conns_.erase(conns_.begin() + static_cast<ptrdiff_t>(*k));
    // Newcomers whose handshakes are done, then the handshakes' threads.
    std::vector<connection> ready;
    {
      std::lock_guard<std::mutex> lock(ready_mutex_);
      ready.swap(ready_);
    }
    for (connection& c : ready) add(std::move(c));
    for (auto it = handshakes_.begin(); it != handshakes_.end();) {
      if (!it->flags->done.load()) {
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
    add(make_connection(plain_stream(c), std::move(peer)));
    return;
  }
  const std::string where = "troupe: step link on port " + std::to_string(port_) + ": ";
  const size_t live = static_cast<size_t>(std::count_if(handshakes_.begin(), handshakes_.end(), [](const handshake& h) {
    return !h.flags->done.load() && !h.flags->cut.load();
  }));
  if (live >= max_handshakes) {
    // Every slot taken: one is cut short (a silent one first; a real handshake takes
    // milliseconds and has sent its first bytes at once).
    auto cut = newcomer_to_cut(handshakes_.begin(), handshakes_.end(), [](const handshake& h) -> const newcomer_flags& {
      return *h.flags;
    });
    if (cut != handshakes_.end()) {
      cut->flags->cut.store(true);
      ::shutdown(cut->fd, SHUT_RDWR);
      if (meter_) meter_->crowded(link_kind::step);
    }
  }
  if (handshakes_.size() >= 4 * max_handshakes) {  // cut ones whose threads are not yet gone
    ::close(c);
    refusals_(where + peer + ": refused: " + std::to_string(handshakes_.size()) + " connections in their handshake already");
    return;
  }
  const int mine = ::fcntl(c, F_DUPFD_CLOEXEC, 0);
  if (mine < 0) {
    ::close(c);
    return;
  }
  auto flags = std::make_shared<newcomer_flags>();
  handshakes_.push_back({c, std::thread([this, mine, peer, where, flags] {
                           // Its first bytes mark it as more than a silent connection.
                           expected<std::unique_ptr<link_stream>> s = error{""};
                           if (wait_readable(mine, link_handshake_ms)) {
                             flags->heard.store(true);
                             s = guard_->server(mine, link_handshake_ms);
                           } else {
                             ::close(mine);
                             s = error{"no TLS handshake within " + std::to_string(link_handshake_ms) + " ms"};
                           }
                           if (s) {
                             connection made = make_connection(std::move(s).value(), peer);
                             std::lock_guard<std::mutex> lock(ready_mutex_);
                             ready_.push_back(std::move(made));
                           } else if (!flags->cut.load()) {  // (cut ones are counted as crowded)
                             if (meter_) meter_->refused(link_kind::step);
                             refusals_(where + peer + ": " + handshake_outcome(s.err().message));
                           }
                           flags->done.store(true);
                           wake();
                         }),
                         flags});
}

bool step_link_server::pump(connection& c, std::string& why) {
  for (;;) {
    const ptrdiff_t r = c.stream->read_some(c.frame.space(), c.frame.wanted());
    if (r < 0) return false;
    if (r == 0) return true;  // the rest later
    if (!c.frame.begun()) c.begun = std::chrono::steady_clock::now();
    if (const status taken = c.frame.took(static_cast<size_t>(r)); !taken) {
      why = taken.err().message;
      return false;
    }
    if (c.frame.whole()) {
      const bool answered = serve(c);
      c.frame.next();
      return answered;  // one step per connection per turn; poll (or buffered()) brings the next
    }
  }
}

bool step_link_server::serve(connection& c) {
  const std::span<const uint8_t> h = c.frame.header(), body = c.frame.body();
  const uint32_t plan_kind = get32(h.data() + 4), plan_len = get32(h.data() + 8), act_kind = get32(h.data() + 12);
  const wire_message plan = message_of(plan_kind, body.first(plan_len));
  const wire_message act = message_of(act_kind, body.subspan(plan_len));
  const expected<wire_message> out = [&]() -> expected<wire_message> {
    try {
      return fn_(plan, act);
    } catch (const std::exception& e) {  // the step's failure, not the link's
      return error{std::string("the step failed: ") + e.what()};
    }
  }();
  ++c.steps;
  link_stream& s = *c.stream;
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

}  // namespace troupe
