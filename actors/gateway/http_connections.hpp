// http_connections: what keeps slow, idle or departed HTTP clients from costing the
// gateway.
//
// The HTTP server gives each connection a thread from accept to close, and a connection
// that sends half a request and waits, or trickles it a byte at a time, holds its thread
// for as long as it likes: a few hundred of them used to leave no thread for anyone else.
// And while a whole (not streamed) answer is being generated the server does not read the
// connection, so it cannot tell that the client has given up. Two things see to that:
//
//  - connection_threads: threads started as connections arrive, up to a cap well above
//    the requests admitted at once (an idle one ends after a while), so that idle and slow
//    connections do not take the places of requests. At the cap a new connection waits
//    for a thread (and those after it in the system's listening queue, holding no
//    descriptor of the process), while room is made for it;
//  - connection_watch: looks at the process's connections on the HTTP port twice a
//    second. A connection must deliver its whole request (head and body) within a
//    deadline, counted from when the watch first sees it or from the answer to its
//    previous request (plus the keep-alive time); one that has not is answered 408 and
//    shut down, which ends its thread's read. A connection whose request is being served
//    and whose client has closed it is noted as gone, so that the request can end. Asked
//    to make room, it does the same to the connection that has waited longest for its
//    request: a flood of idle connections then costs each of them its place, not a
//    working client its answer.
//
// Neither depends on the HTTP library: the gateway adapts them to it.
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace troupe {

class connection_threads {
 public:
  // At most max_threads at once; a thread idle for idle_exit ends (down to keep_threads).
  // make_room: called while a connection waits for a thread (every 100 ms until one is
  // free), to end a connection that is not being served.
  explicit connection_threads(size_t max_threads, std::function<void()> make_room = {},
                              std::chrono::milliseconds idle_exit = std::chrono::seconds(30), size_t keep_threads = 4);
  ~connection_threads();
  connection_threads(const connection_threads&) = delete;
  connection_threads& operator=(const connection_threads&) = delete;

  // Runs fn on a free thread or a new one while under the cap; at the cap, waits for a
  // thread to be free (after release(): queues fn for the next one instead).
  void enqueue(std::function<void()> fn);
  // From now on enqueue does not wait (the server is stopping: its listening thread must
  // not be held).
  void release();
  // Runs what is queued, then joins every thread; enqueue must not be called after.
  void shutdown();

  size_t threads() const;  // running now, busy or idle
  // Waits until at most n threads run, or `bound` passes; whether they are that few.
  bool wait_threads_at_most(size_t n, std::chrono::milliseconds bound) const;

 private:
  void work();
  void join_exited();  // with mu_ held
  bool full() const;   // with mu_ held: no thread free and none may start

  const size_t max_, keep_;
  const std::function<void()> make_room_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mu_;
  std::condition_variable cv_, room_cv_;
  mutable std::condition_variable exit_cv_;  // a thread left work()
  std::deque<std::function<void()>> jobs_;
  std::map<std::thread::id, std::thread> threads_;
  std::vector<std::thread::id> exited_;
  size_t idle_ = 0;
  bool stopping_ = false, released_ = false;
};

class connection_watch {
 public:
  using clock = std::chrono::steady_clock;

  // Watches the connections to local TCP port `port` of this process. A connection kept
  // open after an answer has the server's keep-alive time (keep_alive) on top of the
  // deadline for its next request: until then the server closes it quietly if nothing
  // comes, and an answer then could cross a request the client has just sent.
  connection_watch(uint16_t port, std::chrono::milliseconds deadline,
                   std::chrono::milliseconds keep_alive = std::chrono::milliseconds(0));
  ~connection_watch();
  connection_watch(const connection_watch&) = delete;
  connection_watch& operator=(const connection_watch&) = delete;

  // Looks every `every` (from a thread of its own) until stopped.
  void start(std::chrono::milliseconds every = std::chrono::milliseconds(500));
  void stop();

  // The request of the connection from peer `addr`:`port` has arrived whole / has been
  // answered (the next request on the connection has the deadline from now).
  void arrived(const std::string& addr, int port);
  void answered(const std::string& addr, int port);

  // Whether the client whose request has arrived has since closed its connection (as
  // of the last look).
  bool gone(const std::string& addr, int port);

  // One look at the connections: those past the deadline are answered 408 and shut down,
  // and served ones whose client has closed are noted. Returns how many were shut down.
  // (start() calls it; tests may call it directly.)
  int sweep(clock::time_point now);

  // Answers 408 and shuts down the connection that has waited longest for its request
  // (one first seen by this very look is spared: it may be the newcomer room is made
  // for). Returns whether there was one.
  bool shed(clock::time_point now);

  // Shuts down, without an answer, every connection whose request has not arrived: the
  // server is stopping, and their threads end now rather than at the deadline. Returns
  // how many.
  int close_waiting();

  uint64_t timed_out() const { return timed_out_.load(); }
  std::chrono::milliseconds deadline() const { return deadline_; }

 private:
  struct peer_state {
    bool arrived = false;
    bool gone = false;  // arrived, and closed by the client since
    clock::time_point since;
  };
  struct socket_seen {
    ino_t inode = 0;
    bool ours = false;    // a connection to the port watched
    bool closed = false;  // timed out and shut down here
    std::string peer;
  };
  using found = std::vector<std::pair<int, socket_seen>>;  // by descriptor
  struct look_result {
    found late, served, waiting;  // waiting: every one whose request has not arrived
    found oldest;  // the connection waiting longest for its request, if any
  };

  look_result look(clock::time_point now);  // with scan_mu_ held
  // Sends `answer` (if any) to each and shuts it down; with scan_mu_ held.
  int cut_off(const found& which, const std::string& answer, std::string& first);
  void report(clock::time_point now, const std::string& first);  // with scan_mu_ held

  const uint16_t port_;
  const std::chrono::milliseconds deadline_, keep_alive_;
  std::mutex mu_;
  std::map<std::string, peer_state> peers_;  // by "addr port"
  std::mutex scan_mu_;                       // one look at a time (sweep, shed)
  std::map<int, socket_seen> sockets_;       // by descriptor, under scan_mu_
  DIR* dir_ = nullptr;                       // /proc/self/fd
  int null_fd_ = -1, spare_fd_ = -1;         // /dev/null, and a place for a duplicate
  std::atomic<uint64_t> timed_out_{0};
  uint64_t unreported_ = 0, unreported_shed_ = 0;
  clock::time_point last_report_{};
  std::thread thread_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
};

}  // namespace troupe
