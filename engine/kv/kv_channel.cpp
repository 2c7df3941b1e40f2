#include "engine/kv/kv_channel.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "engine/kv/kv_tiers.hpp"
#include "engine/util/tcp.hpp"

namespace troupe {

namespace {

constexpr uint32_t hello_magic = 0x48564b54;  // "TKVH"
constexpr uint32_t block_magic = 0x42564b54;  // "TKVB"
constexpr uint32_t ack_magic = 0x41564b54;    // "TKVA"
constexpr uint32_t version = 1;
constexpr size_t min_record = 24;   // a sealed record's header

}  // namespace

// -- receiver -------------------------------------------------------------------------------

frame_assembler kv_hello_frames() {
  return frame_assembler(8, [](std::span<const uint8_t> h) -> expected<size_t> {
    if (tcp::get32(h.data()) != hello_magic) return error{"a peer that is not a kv channel sender"};
    if (tcp::get32(h.data() + 4) != version) return error{"a sender of version " + std::to_string(tcp::get32(h.data() + 4))};
    return size_t{0};
  });
}

frame_assembler kv_block_frames(size_t max_record) {
  return frame_assembler(8, [max_record](std::span<const uint8_t> h) -> expected<size_t> {
    if (tcp::get32(h.data()) != block_magic) return error{"a frame that is not a block"};
    const uint32_t len = tcp::get32(h.data() + 4);
    if (len < min_record || len > max_record)
      return error{"a record of " + std::to_string(len) + " bytes (at most " + std::to_string(max_record) + ")"};
    return size_t{len};
  });
}

expected<std::unique_ptr<kv_channel_receiver>> kv_channel_receiver::start(const std::string& host, uint16_t port,
                                                                          sink_fn sink, kv_channel_limits limits,
                                                                          log_fn log, std::shared_ptr<const link_guard> guard,
                                                                          std::shared_ptr<link_meter> meter) {
  auto l = tcp::listen_on(host, port, "kv channel", 64);
  if (!l) return l.err();
  std::unique_ptr<kv_channel_receiver> r(new kv_channel_receiver);
  r->sink_ = std::move(sink);
  if (log) r->log_ = std::make_unique<rate_limited_log>(std::move(log));
  r->guard_ = std::move(guard);
  r->meter_ = std::move(meter);
  r->limits_ = limits;
  r->listen_fd_ = l->fd;
  r->port_ = l->port;
  if (::pipe2(r->wake_, O_CLOEXEC) != 0) {
    ::close(l->fd);
    return error{tcp::errno_text("kv channel: pipe")};
  }
  r->acceptor_ = std::thread([p = r.get()] { p->accept_loop(); });
  return r;
}

kv_channel_receiver::~kv_channel_receiver() {
  if (acceptor_.joinable()) {
    const char b = 1;
    [[maybe_unused]] const ssize_t w = ::write(wake_[1], &b, 1);
    acceptor_.join();
  }
  std::deque<connection> conns;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    conns.swap(connections_);
  }
  for (auto& c : conns) ::shutdown(c.fd, SHUT_RDWR);
  for (auto& c : conns) {
    c.thread.join();
    ::close(c.fd);
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]})
    if (fd >= 0) ::close(fd);
}

kv_channel_stats kv_channel_receiver::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void kv_channel_receiver::refuse(const std::string& peer, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.refused;
  }
  if (meter_) meter_->refused(link_kind::kv);
  if (log_) (*log_)("kv channel: " + peer + ": " + why + "; connection closed");
}

void kv_channel_receiver::late(const std::string& peer, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.late;
  }
  if (meter_) meter_->stalled(link_kind::kv);
  if (log_) (*log_)("kv channel: " + peer + ": " + what + " not whole by its deadline (a stalled link); connection closed");
}

void kv_channel_receiver::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (!(fds[1].revents & POLLIN)) continue;
    sockaddr_storage from{};
    socklen_t from_len = sizeof from;
    const int c = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC);
    if (c < 0) continue;
    const int mine = ::fcntl(c, F_DUPFD_CLOEXEC, 0);
    if (mine < 0) {
      ::close(c);
      continue;
    }
    tcp::no_delay(c);
    const std::string peer = tcp::address_text(from);
    // Finished connections go; past max_pending connections yet to say hello, the oldest
    // of them makes room (senders that said hello are never cut short for a newcomer).
    // Joined outside the lock: a connection's thread takes it for its figures.
    std::deque<connection> gone;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      int waiting = 0;
      for (auto it = connections_.begin(); it != connections_.end();) {
        if (it->phase->load() == done) {
          gone.push_back(std::move(*it));
          it = connections_.erase(it);
        } else {
          waiting += it->phase->load() == pending && !it->flags->cut.load();
          ++it;
        }
      }
      if (waiting >= limits_.max_pending) {
        const auto cut = newcomer_to_cut(connections_.begin(), connections_.end(),
                                         [](const connection& k) -> const newcomer_flags& { return *k.flags; });
        if (cut != connections_.end()) {
          cut->flags->cut.store(true);
          ::shutdown(cut->fd, SHUT_RDWR);
          ++stats_.crowded;
          if (meter_) meter_->crowded(link_kind::kv);
        }
      }
    }
    for (connection& g : gone) {
      g.thread.join();
      ::close(g.fd);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    auto phase = std::make_shared<std::atomic<int>>(pending);
    auto flags = std::make_shared<newcomer_flags>();
    connections_.push_back(connection{c, std::thread([this, c, mine, peer, phase, flags] {
                                        serve(mine, peer, phase, flags);
                                        ::shutdown(c, SHUT_RDWR);
                                        flags->done.store(true);
                                        phase->store(done);
                                      }),
                                      phase, flags});
  }
}

void kv_channel_receiver::said_hello(const std::shared_ptr<std::atomic<int>>& phase, newcomer_flags& flags) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (flags.cut.load()) return;  // cut short meanwhile: its reads fail from now on
  phase->store(sender);
  flags.done.store(true);  // no longer a newcomer
  int senders = 0;
  for (const connection& c : connections_) senders += c.phase->load() == sender;
  if (senders <= limits_.max_connections) return;
  for (connection& old : connections_)
    if (old.phase->load() == sender && old.phase != phase) {
      ::shutdown(old.fd, SHUT_RDWR);
      return;
    }
}

void kv_channel_receiver::serve(int mine, const std::string& peer, const std::shared_ptr<std::atomic<int>>& phase,
                                const std::shared_ptr<newcomer_flags>& flags) {
  // Its first bytes mark it as more than a silent connection; one that sends none is a
  // hello not whole by its deadline.
  const auto begun = std::chrono::steady_clock::now();
  if (!wait_readable(mine, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                               limits_.frame_time.base).count()))) {
    ::close(mine);
    if (!flags->cut.load()) late(peer, "a hello");
    return;
  }
  flags->heard.store(true);
  auto opened = open_server_stream(guard_.get(), mine, link_handshake_ms);
  if (flags->cut.load()) return;  // counted as crowded
  if (!opened) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.refused;
    }
    if (meter_) meter_->refused(link_kind::kv);
    refusals_("troupe: kv channel on port " + std::to_string(port_) + ": " + peer + ": " +
              handshake_outcome(opened.err().message));
    return;
  }
  link_stream& s = **opened;
  s.set_timeout(static_cast<int>(std::chrono::ceil<std::chrono::seconds>(limits_.frame_time.base).count()));  // for acks
  std::string why;
  frame_assembler hello = kv_hello_frames();
  switch (read_frame(s, hello, limits_.frame_time, begun, why)) {
    case frame_read::whole: break;
    case frame_read::closed: return;
    case frame_read::late: return late(peer, "a hello");
    case frame_read::refused: return refuse(peer, why);
  }
  said_hello(phase, *flags);
  frame_assembler record = kv_block_frames(limits_.max_record);
  uint64_t taken = 0;
  for (;;) {
    // Between frames a sender may be quiet as long as it likes; a frame begun must be whole
    // by its deadline.
    pollfd p{s.fd(), POLLIN, 0};
    if (!s.buffered() && ::poll(&p, 1, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    switch (read_frame(s, record, limits_.frame_time, std::chrono::steady_clock::now(), why)) {
      case frame_read::whole: break;
      case frame_read::closed:
        if (record.begun()) refuse(peer, "a block cut short");
        return;  // closed between frames: done
      case frame_read::late: return late(peer, "a block of " + std::to_string(record.frame_bytes()) + " bytes");
      case frame_read::refused: return refuse(peer, why);
    }
    const std::span<const uint8_t> body = record.body();
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(body.data()), body.size());
    const auto name = record_name(bytes);
    if (!name) return refuse(peer, "a record whose header does not add up");
    const auto payload = open_record(*name, bytes);
    if (payload) sink_(*name, *payload);
    taken += body.size();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (payload) {
        ++stats_.records;
        stats_.bytes += body.size();
      } else {
        ++stats_.corrupt;
      }
    }
    if (!payload && log_) (*log_)("kv channel: " + peer + ": a record failing its checksum, dropped");
    record.next();
    uint8_t a[12];
    tcp::put32(a, ack_magic);
    tcp::put64(a + 4, taken);
    if (!s.write_all({{a, sizeof a}})) return;
  }
}

// -- sender ---------------------------------------------------------------------------------

expected<std::unique_ptr<kv_channel_sender>> kv_channel_sender::connect(const std::string& host, uint16_t port,
                                                                        kv_channel_limits limits,
                                                                        std::shared_ptr<const link_guard> guard) {
  auto fd = tcp::connect_to(host, port, connect_timeout_ms, "kv channel");
  if (!fd) return fd.err();
  const std::string to = "kv channel to " + host + ":" + std::to_string(port);
  auto stream = open_client_stream(guard.get(), *fd, link_handshake_ms);
  if (!stream) return error{to + ": " + stream.err().message};
  uint8_t h[8];
  tcp::put32(h, hello_magic);
  tcp::put32(h + 4, version);
  if (!(*stream)->write_all({{h, sizeof h}})) return error{tcp::errno_text(to + ": hello")};
  std::unique_ptr<kv_channel_sender> s(new kv_channel_sender);
  s->limits_ = limits;
  s->stream_ = std::move(stream).value();
  s->reader_ = std::thread([p = s.get()] { p->read_acks(); });
  return s;
}

kv_channel_sender::~kv_channel_sender() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  changed_.notify_all();
  stream_->shutdown();
  if (reader_.joinable()) reader_.join();
  std::lock_guard<std::mutex> w(writing_);  // a send() under way has failed by now
  stream_.reset();
}

void kv_channel_sender::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_.empty() && !closing_) broken_ = why;
  }
  changed_.notify_all();
  stream_->shutdown();
}

std::string kv_channel_sender::broken() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return broken_;
}

kv_channel_stats kv_channel_sender::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

status kv_channel_sender::send(std::string_view name, std::span<const std::byte> payload) {
  const std::vector<std::byte> head = record_head(name, payload);
  const size_t size = head.size() + payload.size();
  if (size > limits_.max_record)
    return error{"kv channel: a record of " + std::to_string(size) + " bytes (at most " +
                 std::to_string(limits_.max_record) + ")"};
  std::lock_guard<std::mutex> turn(writing_);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // The window: at least one record in flight, and no more than `window` bytes past the ack.
    auto room = [&] { return closing_ || !broken_.empty() || sent_ == acked_ || sent_ - acked_ + size <= limits_.window; };
    if (!room()) {
      ++stats_.stalls;
      changed_.wait(lock, room);
    }
    if (!broken_.empty()) return error{"kv channel: " + broken_};
    if (closing_) return error{"kv channel: closing"};
    sent_ += size;  // counted before it goes: its ack may come back before write_all does
  }
  uint8_t h[8];
  tcp::put32(h, block_magic);
  tcp::put32(h + 4, static_cast<uint32_t>(size));
  if (!stream_->write_all({{h, sizeof h}, {head.data(), head.size()}, {payload.data(), payload.size()}})) {
    fail(tcp::errno_text("send"));
    return error{"kv channel: " + broken()};
  }
  return ok();
}

bool kv_channel_sender::flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return !broken_.empty() || acked_ == sent_; }) && broken_.empty();
}

void kv_channel_sender::read_acks() {
  uint8_t a[12];
  for (;;) {
    if (!stream_->read_exact(a, sizeof a)) return fail("the receiver closed the channel");
    if (tcp::get32(a) != ack_magic) return fail("the receiver sent something other than an ack");
    const uint64_t taken = tcp::get64(a + 4);
    std::lock_guard<std::mutex> lock(mutex_);
    if (taken < acked_ || taken > sent_) {
      broken_ = broken_.empty() ? "the receiver acknowledged bytes never sent" : broken_;
      changed_.notify_all();
      stream_->shutdown();
      return;
    }
    if (taken > acked_) ++stats_.records;  // one ack a record
    stats_.bytes = taken;
    acked_ = taken;
    changed_.notify_all();
  }
}

}  // namespace troupe
