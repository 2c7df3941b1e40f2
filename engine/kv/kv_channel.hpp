// kv_channel: KV blocks between node processes over a TCP connection of their own, beside
// CAF's middleman (slow for bulk data: ../shared/notes/caf-capnp-facts.md) and the step
// links. A sender streams sealed records (kv_tiers.hpp: name, length, checksum) to a
// receiver, which checks each and hands it to its sink.
//
// Frames (little-endian):
//   hello  sender -> receiver   "TKVH" u32 version                  first, within 5 s
//   block  sender -> receiver   "TKVB" u32 length, a sealed record  (at most max_record)
//   ack    receiver -> sender   "TKVA" u64 record bytes taken so far
//
// Flow control: a sender keeps at most `window` record bytes beyond the receiver's latest
// ack in flight; send() writes the record itself (its payload never copied) and waits
// while the window is full, so a slow receiver slows its producer instead of growing
// memory. A receiver acknowledges a record once its sink has it. A frame that breaks the
// format (a wrong magic, a record past max_record, a record whose header does not add up)
// ends that connection with a reason; a record failing its checksum is dropped and counted
// (its block is computed again where it was wanted).
//
// What a stranger can hold: a receiver reads a record into a buffer that grows with the
// bytes that arrived (frame_assembler), never to the length announced, and a frame (the
// hello, or a record begun) must be whole within its deadline (5 s, more for a long one at
// 16 MiB/s), else its connection is closed and counted as a stall. Between frames a sender
// may be quiet as long as it likes. Connections that have not yet sent their hello (over
// TLS: not finished their handshake) are counted apart from those that have: at most
// max_pending of them, one cut short for a newcomer (the oldest silent one first:
// engine/util/newcomers.hpp), so a flood of silent connections never pushes out a sender,
// nor one whose handshake is under way; among senders, past max_connections, the oldest
// goes (a sender that vanished).
//
// Secured (a link_guard: TLS with the node's certificate), a channel carries the same
// frames over TLS, after a handshake each receiver connection runs on its own thread; a
// peer that fails it is refused and logged (log lines about strangers are rate-limited).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/util/expected.hpp"
#include "engine/util/frame_assembler.hpp"
#include "engine/util/link_meter.hpp"
#include "engine/util/link_stream.hpp"
#include "engine/util/newcomers.hpp"
#include "engine/util/rate_limited_log.hpp"

namespace troupe {

struct kv_channel_limits {
  size_t max_record = size_t{64} << 20;  // bytes of one record at most
  size_t window = size_t{16} << 20;      // bytes in flight beyond the receiver's ack
  int max_connections = 16;              // a receiver's senders (hello said); the oldest goes for a newcomer
  int max_pending = 32;                  // a receiver's connections before their hello; likewise
  frame_deadline frame_time;             // a whole frame (the hello, a record begun) within this
};

struct kv_channel_stats {
  uint64_t records = 0;  // taken (receiver) or acknowledged (sender)
  uint64_t bytes = 0;
  uint64_t corrupt = 0;  // receiver: records failing their checks, dropped
  uint64_t refused = 0;  // receiver: connections ended for a failed handshake or a broken frame
  uint64_t late = 0;     // receiver: connections ended for a frame not whole by its deadline
  uint64_t crowded = 0;  // receiver: connections cut short for a newcomer before their hello
  uint64_t stalls = 0;   // sender: waits for the receiver's acks (the window was full)
};

// A receiver's frames as it reads them (frame_assembler): first the hello (8 bytes, no
// body; another magic or version refused), then blocks (8 bytes, then a record of
// min_record to max_record bytes). Exposed for the fuzz target that feeds them in pieces.
frame_assembler kv_hello_frames();
frame_assembler kv_block_frames(size_t max_record);

class kv_channel_receiver {
 public:
  // A checked record: its name and payload (spans valid during the call). Called on the
  // connection's thread; what it keeps, it copies.
  using sink_fn = std::function<void(std::string_view name, std::span<const std::byte> payload)>;
  using log_fn = std::function<void(const std::string&)>;

  // Listens on host:port (0: any free port); secured by `guard` (the process's by
  // default; null: plain TCP). What peers did wrong is counted in `meter` as well (none:
  // only in stats()).
  static expected<std::unique_ptr<kv_channel_receiver>> start(
      const std::string& host, uint16_t port, sink_fn sink, kv_channel_limits limits = {}, log_fn log = {},
      std::shared_ptr<const link_guard> guard = process_link_guard(), std::shared_ptr<link_meter> meter = nullptr);
  ~kv_channel_receiver();  // closes every connection, waits for their threads
  kv_channel_receiver(const kv_channel_receiver&) = delete;
  kv_channel_receiver& operator=(const kv_channel_receiver&) = delete;

  uint16_t port() const { return port_; }
  kv_channel_stats stats() const;

 private:
  kv_channel_receiver() = default;
  void accept_loop();
  // One connection: `fd` is the receiver's (shut down to end it), `mine` a duplicate the
  // connection's stream owns.
  void serve(int mine, const std::string& peer, const std::shared_ptr<std::atomic<int>>& phase,
             const std::shared_ptr<newcomer_flags>& flags);
  // Its hello said: counted among the senders, the oldest of them going past the limit.
  void said_hello(const std::shared_ptr<std::atomic<int>>& phase, newcomer_flags& flags);
  void refuse(const std::string& peer, const std::string& why);
  void late(const std::string& peer, const std::string& what);

  sink_fn sink_;
  std::unique_ptr<rate_limited_log> log_;  // through the log_fn given
  rate_limited_log refusals_;              // handshakes refused (stderr), this receiver's own budget
  std::shared_ptr<link_meter> meter_;
  std::shared_ptr<const link_guard> guard_;
  kv_channel_limits limits_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::thread acceptor_;
  mutable std::mutex mutex_;
  enum phase : int { pending, sender, done };
  struct connection {
    int fd;
    std::thread thread;
    std::shared_ptr<std::atomic<int>> phase;  // pending, then sender, then done
    std::shared_ptr<newcomer_flags> flags;    // while pending (engine/util/newcomers.hpp)
  };
  std::deque<connection> connections_;
  kv_channel_stats stats_;
};

class kv_channel_sender {
 public:
  static constexpr int connect_timeout_ms = 2000;

  static expected<std::unique_ptr<kv_channel_sender>> connect(
      const std::string& host, uint16_t port, kv_channel_limits limits = {},
      std::shared_ptr<const link_guard> guard = process_link_guard());
  ~kv_channel_sender();  // stops at once: what is queued and unacknowledged is lost
  kv_channel_sender(const kv_channel_sender&) = delete;
  kv_channel_sender& operator=(const kv_channel_sender&) = delete;

  // Writes `payload` as a record of `name`, once the window has room (one sender thread at
  // a time; others wait their turn). An error once the channel broke (its reason), or for
  // a record past max_record.
  status send(std::string_view name, std::span<const std::byte> payload);
  // Waits until the receiver has taken everything sent: true, or false when the channel
  // broke or `timeout` passed first.
  bool flush(std::chrono::milliseconds timeout);
  // Why the channel broke; empty while it works.
  std::string broken() const;
  kv_channel_stats stats() const;

 private:
  kv_channel_sender() = default;
  void read_acks();
  void fail(const std::string& why);

  kv_channel_limits limits_;
  std::unique_ptr<link_stream> stream_;
  std::thread reader_;
  std::mutex writing_;               // one record on the socket at a time
  mutable std::mutex mutex_;         // the rest
  std::condition_variable changed_;
  uint64_t sent_ = 0, acked_ = 0;    // record bytes
  bool closing_ = false;
  std::string broken_;
  kv_channel_stats stats_;
};

}  // namespace troupe
