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

expected<std::unique_ptr<kv_channel_receiver>> kv_channel_receiver::start(const std::string& host, uint16_t port,
                                                                          sink_fn sink, kv_channel_limits limits,
                                                                          log_fn log, std::shared_ptr<const link_guard> guard) {
  auto l = tcp::listen_on(host, port, "kv channel", 16);
  if (!l) return l.err();
  std::unique_ptr<kv_channel_receiver> r(new kv_channel_receiver);
  r->sink_ = std::move(sink);
  r->log_ = std::move(log);
  r->guard_ = std::move(guard);
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

void kv_channel_receiver::refuse(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.refused;
  }
  if (log_) log_("kv channel: " + why + "; connection closed");
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
    // Finished connections go; past the limit, the oldest makes room (a sender that
    // vanished). Joined outside the lock: a connection's thread takes it for its figures.
    std::deque<connection> gone;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = connections_.begin(); it != connections_.end();) {
        if (it->done->load()) {
          gone.push_back(std::move(*it));
          it = connections_.erase(it);
        } else {
          ++it;
        }
      }
      if (static_cast<int>(connections_.size()) >= limits_.max_connections) {
        ::shutdown(connections_.front().fd, SHUT_RDWR);
        gone.push_back(std::move(connections_.front()));
        connections_.pop_front();
      }
    }
    for (connection& g : gone) {
      g.thread.join();
      ::close(g.fd);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    auto done = std::make_shared<std::atomic<bool>>(false);
    connections_.push_back(connection{c, std::thread([this, c, mine, peer, done] {
                                        serve(mine, peer);
                                        ::shutdown(c, SHUT_RDWR);
                                        done->store(true);
                                      }),
                                      done});
  }
}

void kv_channel_receiver::serve(int mine, const std::string& peer) {
  auto opened = open_server_stream(guard_.get(), mine, link_handshake_ms);
  if (!opened) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.refused;
    }
    log_link_refusal("troupe: kv channel on port " + std::to_string(port_) + ": " + peer + ": refused: " + opened.err().message);
    return;
  }
  link_stream& s = **opened;
  s.set_timeout(limits_.frame_timeout_s);
  uint8_t h[8];
  if (!s.read_exact(h, sizeof h)) return refuse("no hello within " + std::to_string(limits_.frame_timeout_s) + " s");
  if (tcp::get32(h) != hello_magic) return refuse("a peer that is not a kv channel sender");
  if (tcp::get32(h + 4) != version) return refuse("a sender of version " + std::to_string(tcp::get32(h + 4)));
  std::vector<std::byte> record;
  uint64_t taken = 0;
  for (;;) {
    // Between frames a sender may be quiet as long as it likes; within one, 5 s.
    pollfd p{s.fd(), POLLIN, 0};
    if (!s.buffered() && ::poll(&p, 1, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (!s.read_exact(h, sizeof h)) return;  // closed between frames: done
    if (tcp::get32(h) != block_magic) return refuse("a frame that is not a block");
    const uint32_t len = tcp::get32(h + 4);
    if (len < min_record || len > limits_.max_record)
      return refuse("a record of " + std::to_string(len) + " bytes (at most " + std::to_string(limits_.max_record) + ")");
    record.resize(len);
    if (!s.read_exact(record.data(), len)) return refuse("a block cut short");
    const auto name = record_name(record);
    if (!name) return refuse("a record whose header does not add up");
    const auto payload = open_record(*name, record);
    if (payload) sink_(*name, *payload);
    taken += len;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (payload) {
        ++stats_.records;
        stats_.bytes += len;
      } else {
        ++stats_.corrupt;
      }
    }
    if (!payload && log_) log_("kv channel: a record failing its checksum, dropped");
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
