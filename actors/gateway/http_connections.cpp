#include "actors/gateway/http_connections.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>

namespace troupe {

connection_threads::connection_threads(size_t max_threads, std::function<void()> make_room,
                                       std::chrono::milliseconds idle_exit, size_t keep_threads)
    : max_(max_threads < 1 ? 1 : max_threads),
      keep_(keep_threads),
      make_room_(std::move(make_room)),
      idle_exit_(idle_exit) {}

connection_threads::~connection_threads() { shutdown(); }

bool connection_threads::full() const {
  // Idle threads count what is queued against themselves: two jobs and one idle thread
  // leave none free.
  return jobs_.size() >= idle_ && threads_.size() - exited_.size() >= max_;
}

void connection_threads::enqueue(std::function<void()> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  join_exited();
  while (full() && !released_ && !stopping_) {
    if (make_room_) {
      lock.unlock();
      make_room_();
      lock.lock();
    }
    room_cv_.wait_for(lock, std::chrono::milliseconds(100));
    join_exited();
  }
  jobs_.push_back(std::move(fn));
  // A thread that is idle takes it; otherwise a new one, while there is room.
  if (jobs_.size() > idle_ && threads_.size() - exited_.size() < max_) {
    std::thread t([this] { work(); });
    const std::thread::id id = t.get_id();
    threads_.emplace(id, std::move(t));
  }
  lock.unlock();
  cv_.notify_one();
}

void connection_threads::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
  }
  room_cv_.notify_all();
}

void connection_threads::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    room_cv_.notify_one();
    const bool woke = cv_.wait_for(lock, idle_exit_, [&] { return !jobs_.empty() || stopping_; });
    --idle_;
    if (jobs_.empty()) {
      // Stopping, or idle for long enough while enough others remain.
      if (stopping_ || (!woke && threads_.size() - exited_.size() > keep_)) break;
      continue;
    }
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
  exited_.push_back(std::this_thread::get_id());
  exit_cv_.notify_all();
}

void connection_threads::join_exited() {
  for (const std::thread::id id : exited_) {
    auto it = threads_.find(id);
    if (it == threads_.end()) continue;
    it->second.join();  // it has left work(): only its return remains
    threads_.erase(it);
  }
  exited_.clear();
}

void connection_threads::shutdown() {
  std::map<std::thread::id, std::thread> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    all.swap(threads_);
    exited_.clear();
  }
  cv_.notify_all();
  room_cv_.notify_all();
  for (auto& [id, t] : all) t.join();
}

size_t connection_threads::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_.size() - exited_.size();
}

bool connection_threads::wait_threads_at_most(size_t n, std::chrono::milliseconds bound) const {
  std::unique_lock<std::mutex> lock(mu_);
  return exit_cv_.wait_for(lock, bound, [&] { return threads_.size() - exited_.size() <= n; });
}

namespace {

std::string peer_key(const std::string& addr, int port) { return addr + " " + std::to_string(port); }

// The local port and the peer of a connected TCP socket (nothing for anything else).
bool tcp_endpoints(int fd, uint16_t& local_port, std::string& addr, int& peer_port) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) return false;
  if (a.ss_family == AF_INET)
    local_port = ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  else if (a.ss_family == AF_INET6)
    local_port = ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  else
    return false;
  n = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) return false;  // the listening socket
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&a), n, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  addr = host;
  peer_port = std::atoi(serv);
  return true;
}

}  // namespace

connection_watch::connection_watch(uint16_t port, std::chrono::milliseconds deadline,
                                   std::chrono::milliseconds keep_alive)
    : port_(port), deadline_(deadline), keep_alive_(keep_alive) {
  // Everything a sweep needs is opened now: when connections have taken every descriptor
  // the process may have is when the sweep is needed most.
  dir_ = opendir("/proc/self/fd");
  null_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  spare_fd_ = null_fd_ < 0 ? -1 : fcntl(null_fd_, F_DUPFD_CLOEXEC, 0);
}

connection_watch::~connection_watch() {
  stop();
  if (dir_) closedir(dir_);
  if (spare_fd_ >= 0) ::close(spare_fd_);
  if (null_fd_ >= 0) ::close(null_fd_);
}

void connection_watch::start(std::chrono::milliseconds every) {
  thread_ = std::thread([this, every] {
    std::unique_lock<std::mutex> lock(stop_mu_);
    while (!stop_cv_.wait_for(lock, every, [&] { return stop_; })) {
      lock.unlock();
      sweep(clock::now());
      lock.lock();
    }
  });
}

void connection_watch::stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void connection_watch::arrived(const std::string& addr, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_[peer_key(addr, port)].arrived = true;
}

bool connection_watch::gone(const std::string& addr, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer_key(addr, port));
  return it != peers_.end() && it->second.gone;
}

void connection_watch::answered(const std::string& addr, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  peer_state& p = peers_[peer_key(addr, port)];
  p.arrived = false;
  p.gone = false;
  p.since = clock::now() + keep_alive_;
}

namespace {

// What a connection whose request did not arrive in time is told.
const std::string& late_answer() {
  static const std::string a = [] {
    const std::string body =
        R"({"error":{"message":"the request did not arrive in time","type":"invalid_request_error","param":null,"code":"timeout"}})";
    return "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  return a;
}

}  // namespace

int connection_watch::sweep(clock::time_point now) {
  std::lock_guard<std::mutex> scanning(scan_mu_);
  if (!dir_ || spare_fd_ < 0) return 0;
  const look_result seen = look(now);
  std::string first;
  const int closed = cut_off(seen.late, late_answer(), first);
  timed_out_ += static_cast<uint64_t>(closed);
  unreported_ += static_cast<uint64_t>(closed);
  // A served connection the client has closed reads as its end (a peek finds no byte and
  // no wait); one that has sent more (the next request) or nothing is still there.
  for (const auto& [fd, s] : seen.served) {
    if (dup2(fd, spare_fd_) < 0) continue;
    struct stat st {};
    char b;
    if (fstat(spare_fd_, &st) == 0 && st.st_ino == s.inode && recv(spare_fd_, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = peers_.find(s.peer); it != peers_.end()) it->second.gone = true;
    }
    dup2(null_fd_, spare_fd_);
  }
  report(now, first);
  return closed;
}

bool connection_watch::shed(clock::time_point now) {
  std::lock_guard<std::mutex> scanning(scan_mu_);
  if (!dir_ || spare_fd_ < 0) return false;
  std::string first;
  const int closed = cut_off(look(now).oldest, late_answer(), first);
  unreported_shed_ += static_cast<uint64_t>(closed);
  report(now, first);
  return closed > 0;
}

int connection_watch::close_waiting() {
  std::lock_guard<std::mutex> scanning(scan_mu_);
  if (!dir_ || spare_fd_ < 0) return 0;
  // (Closed without an answer, as a server closes an idle connection: a client retries
  // a request on a connection closed before any answer to it.)
  std::string first;
  return cut_off(look(clock::now()).waiting, "", first);
}

connection_watch::look_result connection_watch::look(clock::time_point now) {
  // The process's descriptors, as the kernel lists them; the gateway's connections are
  // the connected TCP sockets on its port. A descriptor is known by its number and the
  // socket's inode, so a number closed and reused is a new connection.
  rewinddir(dir_);  // the kernel lists the descriptors afresh
  look_result r;
  std::set<int> present;
  std::set<std::string> live;
  std::lock_guard<std::mutex> lock(mu_);
  clock::time_point oldest_since = clock::time_point::max();
  while (const dirent* e = readdir(dir_)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end || fd == dirfd(dir_) || fd == spare_fd_ || fd == null_fd_) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    present.insert(static_cast<int>(fd));
    socket_seen& s = sockets_[static_cast<int>(fd)];
    bool first_seen = false;
    if (s.inode != st.st_ino) {
      s = socket_seen{st.st_ino, false, false, {}};
      uint16_t local = 0;
      std::string addr;
      int pport = 0;
      if (tcp_endpoints(static_cast<int>(fd), local, addr, pport) && local == port_) {
        s.ours = true;
        s.peer = peer_key(addr, pport);
        first_seen = peers_.try_emplace(s.peer, peer_state{false, false, now}).second;
      }
    }
    if (!s.ours || s.closed) continue;
    live.insert(s.peer);
    const peer_state& p = peers_.try_emplace(s.peer, peer_state{false, false, now}).first->second;
    if (!p.arrived && now - p.since > deadline_) r.late.emplace_back(static_cast<int>(fd), s);
    if (!p.arrived) r.waiting.emplace_back(static_cast<int>(fd), s);
    if (!p.arrived && !first_seen && p.since < oldest_since) {
      oldest_since = p.since;
      r.oldest.assign(1, {static_cast<int>(fd), s});
    }
    if (p.arrived && !p.gone) r.served.emplace_back(static_cast<int>(fd), s);
  }
  for (auto it = sockets_.begin(); it != sockets_.end();) it = present.count(it->first) ? std::next(it) : sockets_.erase(it);
  for (auto it = peers_.begin(); it != peers_.end();) it = live.count(it->first) ? std::next(it) : peers_.erase(it);
  return r;
}

int connection_watch::cut_off(const found& which, const std::string& answer, std::string& first) {
  // Each connection through a duplicate of its descriptor (made in the spare descriptor,
  // so that none more is needed), checked to be the same socket: the server's thread may
  // close the original meanwhile and the number be reused, but the duplicate holds on to
  // the socket it was made from.
  int closed = 0;
  for (const auto& [fd, seen] : which) {
    if (dup2(fd, spare_fd_) < 0) continue;
    struct stat st {};
    // (Under the lock: a request that has arrived since the look is left alone, and one
    // arriving now waits until its connection has been answered.)
    std::lock_guard<std::mutex> lock(mu_);
    const auto p = peers_.find(seen.peer);
    if (fstat(spare_fd_, &st) == 0 && st.st_ino == seen.inode && p != peers_.end() && !p->second.arrived) {
      if (!answer.empty()) (void)send(spare_fd_, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      ::shutdown(spare_fd_, SHUT_RDWR);
      ++closed;
      if (first.empty()) first = seen.peer;
      sockets_[fd].closed = true;  // its thread closes it in its own time
    }
    dup2(null_fd_, spare_fd_);  // lets go of the socket
  }
  return closed;
}

void connection_watch::report(clock::time_point now, const std::string& first) {
  // One line at most every ten seconds, however many there are.
  if ((unreported_ == 0 && unreported_shed_ == 0) || now - last_report_ < std::chrono::seconds(10)) return;
  const auto at = first.find(' ');
  std::string line = "troupe-http: closed ";
  if (unreported_ > 0)
    line += std::to_string(unreported_) + " connection(s) that had not sent a whole request within " +
            std::to_string(deadline_.count()) + " ms";
  if (unreported_ > 0 && unreported_shed_ > 0) line += ", and ";
  if (unreported_shed_ > 0)
    line += std::to_string(unreported_shed_) +
            " waiting for their request to make room for new ones (every connection thread busy: max_connections)";
  line += " (answered 408)";
  if (!first.empty()) line += "; one from " + first.substr(0, at);
  std::fprintf(stderr, "%s\n", line.c_str());
  unreported_ = 0;
  unreported_shed_ = 0;
  last_report_ = now;
}

}  // namespace troupe
