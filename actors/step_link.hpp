// step_link: a TCP connection that carries a remote stage's steps, beside CAF's middleman.
//
// A token of a pipeline crosses processes twice per step. Through the middleman each
// crossing wakes three threads (the sender's multiplexer, the receiver's multiplexer, a
// worker of the receiver's scheduler); over a step link it wakes one: the shard's link
// thread reads the step and runs it, and the scheduler's link thread reads the answer and
// hands it to the scheduler actor. Only a stage of one CPU shard in another process
// offers a link; the scheduler asks for it after finding the stage and sends that
// stage's steps nowhere else until the stage is lost, so the plans, whose encoding
// refers to earlier ones, arrive in order. Everything else (lookups, monitoring,
// heartbeats, failure detection) stays with CAF.
//
// Frames (little-endian u32 fields):
//   step:   "TRSL" plan_kind plan_len act_kind act_len, plan bytes, act bytes
//   answer: "TRSL" status kind len, bytes (status 0: a wire_message of `kind`; 1: an
//           error text, the step failed)
// Kinds are wire_kind values; a length is at most wire_message::max_frame_bytes. A frame
// that breaks these rules ends the connection (the server then waits for the next); the
// payloads are the same Cap'n Proto frames the actor messages carry, checked by the same
// decoders.
//
// The server reads every connection as its bytes arrive (frame_assembler), never waiting
// on one: a step is run once its frame is whole, and a frame not whole within its
// deadline (5 s, and more for a long one at 16 MiB/s) ends its connection, counted as a
// stall (link_meter) and logged. A peer trickling a frame byte by byte therefore delays
// no other connection's steps, and holds no more memory than the bytes it sent.
//
// Secured (a link_guard: TLS with the node's certificate), a link carries the same frames
// over TLS; the server runs each newcomer's handshake on a thread of its own, so a
// stranger that stalls its handshake holds up no step, and logs each peer it refuses.
// Handshakes have 32 slots; a newcomer finding them all taken cuts one short (the oldest
// that has sent nothing: engine/util/newcomers.hpp), so silent connections cannot keep a
// peer with a valid certificate out.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/caf/wire_message.hpp"
#include "engine/util/expected.hpp"
#include "engine/util/frame_assembler.hpp"
#include "engine/util/link_meter.hpp"
#include "engine/util/newcomers.hpp"
#include "engine/util/rate_limited_log.hpp"
#include "engine/util/link_stream.hpp"
#include "engine/util/tcp.hpp"

namespace troupe {

// The server's frames as it reads them (frame_assembler): a 20-byte step header (magic,
// kinds, lengths, checked as above), then the plan's and the activations' bytes as one
// body. Exposed for the fuzz target that feeds them in pieces.
frame_assembler step_link_frames();

// Runs the steps of every connection (the scheduler's; a new one after a loss; at most
// eight, the oldest that never stepped closed first, else the oldest) on its own thread, one at a time, each connection's in
// its order. Like the middleman's port, it belongs on the cluster's own network.
class step_link_server {
 public:
  using step_fn = std::function<expected<wire_message>(const wire_message& plan, const wire_message& act)>;

  // Listens on host, on the first free port of `ports` (any port by default); secured by
  // `guard` (the process's by default; null: plain TCP).
  // What its peers did wrong is counted in `meter` (none: not counted); a step frame must
  // be whole within `frame_time` of its first byte.
  static expected<std::unique_ptr<step_link_server>> start(const std::string& host, step_fn fn,
                                                           tcp::port_range ports = {},
                                                           std::shared_ptr<const link_guard> guard = process_link_guard(),
                                                           std::shared_ptr<link_meter> meter = nullptr,
                                                           frame_deadline frame_time = {});
  ~step_link_server();  // closes the sockets; waits for a running step to end

  step_link_server(const step_link_server&) = delete;
  step_link_server& operator=(const step_link_server&) = delete;

  uint16_t port() const { return port_; }

 private:
  step_link_server() = default;
  struct connection {
    std::unique_ptr<link_stream> stream;
    std::string peer;  // its address, for the log
    frame_assembler frame;  // the step being read
    std::chrono::steady_clock::time_point begun;  // when its first byte came
    uint64_t steps = 0;  // steps it had answered
  };
  connection make_connection(std::unique_ptr<link_stream> s, std::string peer);
  void add(connection c);
  // A newcomer in its handshake, on its own thread: the thread owns a duplicate of `fd`
  // (closed by the thread on failure), and shutting `fd` down ends the handshake at once.
  struct handshake {
    int fd;
    std::thread thread;
    std::shared_ptr<newcomer_flags> flags;
  };
  void run();
  void accept_one();
  // Reads what c's peer sent and runs its step once the frame is whole; false: the
  // connection is done, `why` saying how the peer broke the protocol (empty when it
  // closed).
  bool pump(connection& c, std::string& why);
  // Runs a whole step and writes its answer; false when the answer cannot be written.
  bool serve(connection& c);
  // When the first unfinished frame's deadline passes (nullopt: none is under way).
  std::optional<std::chrono::steady_clock::time_point> next_deadline() const;
  void wake();

  step_fn fn_;
  std::shared_ptr<const link_guard> guard_;
  std::shared_ptr<link_meter> meter_;
  frame_deadline deadline_;
  rate_limited_log refusals_;  // lines about peers it refused or cut off (stderr), this link's own budget
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: the destructor and finished handshakes write
  std::atomic<bool> stopping_{false};
  uint16_t port_ = 0;
  std::vector<connection> conns_;     // run()'s
  std::vector<handshake> handshakes_;  // run()'s, then the destructor's
  std::mutex ready_mutex_;
  std::vector<connection> ready_;  // handshakes done, for run() to take
  std::thread thread_;
};

// The scheduler's end. send() is called from one thread at a time and never waits for
// the stage: what the socket does not take at once (a large step while the stage is busy)
// goes to the link's writer thread, and later steps queue behind it. Answers arrive in
// order on the link's reader thread, through on_answer; a broken connection is reported
// once through on_broken (not when the client is destroyed), and from then on send()
// refuses at once.
class step_link_client {
 public:
  using answer_fn = std::function<void(expected<wire_message>)>;
  using broken_fn = std::function<void(const std::string& why)>;

  // Connects, and over a secured link completes the handshake, within a few seconds.
  static expected<std::unique_ptr<step_link_client>> connect(
      const std::string& host, uint16_t port, answer_fn on_answer, broken_fn on_broken,
      std::shared_ptr<const link_guard> guard = process_link_guard());
  ~step_link_client();

  step_link_client(const step_link_client&) = delete;
  step_link_client& operator=(const step_link_client&) = delete;

  status send(const wire_message& plan, const wire_message& act);

 private:
  step_link_client() = default;
  void read_answers();
  void write_backlog();
  void report(const std::string& why);

  std::unique_ptr<link_stream> stream_;
  answer_fn on_answer_;
  broken_fn on_broken_;
  std::atomic<bool> closing_{false};
  std::atomic<bool> reported_{false};
  std::mutex mutex_;  // guards backlog_ and failed_
  std::condition_variable wake_writer_;
  std::deque<std::vector<uint8_t>> backlog_;  // bytes the socket has not taken yet, in order
  std::string failed_;                         // why the link broke (the writer or the reader saw it)
  std::thread reader_, writer_;
};

}  // namespace troupe
