#include "actors/tls/node_links.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>
#include <caf/io/network/stream.hpp>
#include <openssl/err.h>

#include "engine/util/link_stream.hpp"
#include "engine/util/tcp.hpp"

namespace troupe {

namespace {

namespace net = caf::io::network;
using rw_state = net::rw_state;

constexpr int connect_ms = 1000;  // the TCP handshake to a peer

const caf::atom_value links_key = caf::atom("troupelink");

// Connections still in their TLS handshake, each shut down once past its deadline by one
// watcher thread (the multiplexer has no timers of its own). A socket leaves the table
// before it is closed, so the watcher never touches a reused descriptor.
class handshake_watch {
 public:
  static handshake_watch& instance() {
    static handshake_watch w;
    return w;
  }
  // `what`: the log line's start, "troupe: node link ...: "; `timed_out`: the stream's flag,
  // set when the watcher closes it (the stream then says nothing more of it).
  void add(const void* who, int fd, std::string what, std::atomic<bool>* timed_out) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[who] = {fd, std::move(what), std::chrono::steady_clock::now() + std::chrono::milliseconds(handshake_ms),
                     timed_out};
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  void remove(const void* who) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(who);
  }
  ~handshake_watch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct entry {
    int fd;
    std::string what;
    std::chrono::steady_clock::time_point deadline;
    std::atomic<bool>* timed_out;
  };
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(250));
      const auto now = std::chrono::steady_clock::now();
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.deadline > now) {
          ++it;
          continue;
        }
        // The multiplexer sees the end of the stream and closes it as any other.
        *it->second.timed_out = true;
        ::shutdown(it->second.fd, SHUT_RDWR);
        log_link_refusal(it->second.what + "no TLS handshake within " + std::to_string(handshake_ms) + " ms; closed");
        it = pending_.erase(it);
      }
    }
  }
  std::mutex mu_;
  std::condition_variable wake_;
  std::map<const void*, entry> pending_;
  std::thread thread_;
  bool stop_ = false;
};

// One TLS connection over a non-blocking socket, driven by CAF's multiplexer: the
// handshake first, on either side, then records. While the handshake waits for the peer,
// pending writes leave the poll set (else a silent peer would spin the multiplexer) and
// return once it is done. No thread ever waits for a peer's handshake.
class tls_stream : public net::stream {
 public:
  // `port`: the listening port (accepted) or the peer's (connecting); `peer`: "host:port"
  // of the node connected to, empty for an accepted connection (its address is read here).
  // `owner`: the scribe this stream belongs to, kept alive while a write is parked.
  tls_stream(net::default_multiplexer& mpx, int fd, tls::ssl_ptr ssl, uint16_t port, const std::string& peer,
             net::stream_manager* owner)
      : net::stream(mpx, fd), ssl_(std::move(ssl)), owner_(owner) {
    if (peer.empty()) {
      auto addr = net::remote_addr_of_fd(fd);
      auto peer_port = net::remote_port_of_fd(fd);
      what_ = "troupe: node link on port " + std::to_string(port) + ": " + (addr ? *addr : std::string("?")) + ":" +
              std::to_string(peer_port ? *peer_port : 0) + ": ";
    } else {
      what_ = "troupe: node link to " + peer + ": ";
    }
    handshake_watch::instance().add(this, fd, what_, &timed_out_);
  }
  ~tls_stream() override {
    if (!established_) handshake_watch::instance().remove(this);
  }

  void removed_from_loop(net::operation op) override {
    // Out of the loop for good: a parked write's hold goes too (last, as it may be the
    // scribe's last reference, as CAF's own are).
    auto hold = op == net::operation::read ? std::move(parked_) : nullptr;
    net::stream::removed_from_loop(op);
  }

  void handle_event(net::operation op) override {
    struct policy {
      tls_stream& s;
      rw_state read_some(size_t& n, net::native_socket, void* buf, size_t len) { return s.read_some(n, buf, len); }
      rw_state write_some(size_t& n, net::native_socket, const void* buf, size_t len) { return s.write_some(n, buf, len); }
      bool must_read_more(net::native_socket, size_t threshold) {
        return s.established_ && static_cast<size_t>(SSL_pending(s.ssl_.get())) >= threshold;
      }
    } p{*this};
    handle_event_impl(op, p);
  }

 private:
  // 1: done; 0: waiting for the peer; -1: failed (and said why).
  int handshake() {
    if (failed_) return -1;
    ERR_clear_error();
    const int r = SSL_do_handshake(ssl_.get());
    if (r == 1) {
      established_ = true;
      handshake_watch::instance().remove(this);
      if (parked_) {
        // Back in the poll set as CAF's own flush would put it, the pending bytes untouched.
        state_.writing = false;
        force_empty_write(parked_);
        parked_.reset();
      }
      return 1;
    }
    const int e = SSL_get_error(ssl_.get(), r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return 0;
    if (!timed_out_) log_link_refusal(what_ + handshake_outcome(tls::handshake_failure(ssl_.get(), r)));
    failed_ = true;
    return -1;
  }
  rw_state read_some(size_t& n, void* buf, size_t len) {
    n = 0;
    if (!established_) {
      const int h = handshake();
      if (h < 0) return rw_state::failure;
      if (h == 0) return rw_state::success;  // nothing yet: wait for the next read event
    }
    if (len == 0) return rw_state::success;
    ERR_clear_error();
    return record_result(SSL_read(ssl_.get(), buf, static_cast<int>(len)), n);
  }
  rw_state write_some(size_t& n, const void* buf, size_t len) {
    n = 0;
    if (!established_) {
      const int h = handshake();
      if (h < 0) return rw_state::failure;
      if (h == 0) {
        if (!parked_) {
          // Leaving the poll set drops the stream's hold on its scribe: hold it here.
          parked_.reset(owner_);
          backend().del(net::operation::write, fd(), this);
        }
        return rw_state::success;
      }
    }
    if (len == 0) return rw_state::indeterminate;
    ERR_clear_error();
    return record_result(SSL_write(ssl_.get(), buf, static_cast<int>(len)), n);
  }
  // An SSL_read's or SSL_write's result r for CAF: bytes moved, nothing yet (the socket
  // not ready; the multiplexer calls again), or the link's end.
  rw_state record_result(int r, size_t& n) {
    if (r > 0) {
      n = static_cast<size_t>(r);
      return rw_state::success;
    }
    const int e = SSL_get_error(ssl_.get(), r);
    return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? rw_state::success : rw_state::failure;
  }

  tls::ssl_ptr ssl_;
  bool established_ = false;
  net::stream_manager* owner_;
  caf::intrusive_ptr<net::stream_manager> parked_;  // set while a write waits for the handshake
  bool failed_ = false;
  std::atomic<bool> timed_out_{false};
  std::string what_;
};

class tls_scribe : public caf::io::scribe {
 public:
  tls_scribe(net::default_multiplexer& mpx, int fd, tls::ssl_ptr ssl, uint16_t port, const std::string& peer)
      : caf::io::scribe(net::conn_hdl_from_socket(fd)), stream_(mpx, fd, std::move(ssl), port, peer, this) {}
  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) {
      launched_ = true;
      stream_.start(this);
      // A write with nothing to write starts the handshake (the connecting side's first
      // flight) whether or not the broker writes first.
      stream_.force_empty_write(this);
    }
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = net::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  uint16_t port() const override {
    auto x = net::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  bool launched_ = false;
  tls_stream stream_;
};

class tls_doorman : public net::doorman_impl {
 public:
  tls_doorman(net::default_multiplexer& mpx, int fd, std::shared_ptr<tls::context> ctx, uint16_t port)
      : net::doorman_impl(mpx, fd), ctx_(std::move(ctx)), port_(port) {}
  bool new_connection() override {
    if (detached()) return false;
    auto& mpx = acceptor_.backend();
    const int fd = acceptor_.accepted_socket();
    net::nonblocking(fd, true);
    net::tcp_nodelay(fd, true);
    tls::ssl_ptr ssl(SSL_new(ctx_->get()));
    if (!ssl || SSL_set_fd(ssl.get(), fd) != 1) {
      ::close(fd);
      return false;
    }
    SSL_set_accept_state(ssl.get());
    auto scribe = caf::make_counted<tls_scribe>(mpx, fd, std::move(ssl), port_, "");
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return caf::io::doorman::new_connection(&mpx, hdl);
  }

 private:
  std::shared_ptr<tls::context> ctx_;
  uint16_t port_;
};

// Troupe's middleman actor: CAF's, but its connections are made within a time limit
// (CAF's own waits in a blocking connect() for the kernel's retries, minutes, to a peer
// that drops SYNs) and, with a TLS context, over TLS both ways.
class links_actor : public caf::io::middleman_actor_impl {
 public:
  links_actor(caf::actor_config& cfg, caf::actor basp, std::shared_ptr<tls::context> ctx)
      : caf::io::middleman_actor_impl(cfg, std::move(basp)), ctx_(std::move(ctx)) {}
  const char* name() const override { return "troupe.node_links"; }

 protected:
  // The TCP connection within its time (this actor's thread waits for it); the TLS
  // handshake then runs in the multiplexer, with the other side's and the same deadline.
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, uint16_t port) override {
    const std::string who = "node " + host + ":" + std::to_string(port);
    auto fd = tcp::connect_to(host, port, connect_ms, who);
    if (!fd) return caf::make_error(caf::sec::cannot_connect_to_node, fd.err().message);
    net::nonblocking(*fd, true);
    if (!ctx_) return mpx().new_scribe(*fd);
    tls::ssl_ptr ssl(SSL_new(ctx_->get()));
    if (!ssl || SSL_set_fd(ssl.get(), *fd) != 1) {
      ::close(*fd);
      return caf::make_error(caf::sec::cannot_connect_to_node, who + ": cannot start TLS: " + tls::error_queue("no reason"));
    }
    SSL_set_connect_state(ssl.get());
    return caf::make_counted<tls_scribe>(mpx(), *fd, std::move(ssl), port, host + ":" + std::to_string(port));
  }
  caf::expected<caf::io::doorman_ptr> open(uint16_t port, const char* addr, bool reuse) override {
    if (!ctx_) return caf::io::middleman_actor_impl::open(port, addr, reuse);
    auto fd = net::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd) return std::move(fd.error());
    auto bound = net::local_port_of_fd(*fd);
    return caf::make_counted<tls_doorman>(mpx(), *fd, ctx_, bound ? *bound : port);
  }

 private:
  net::default_multiplexer& mpx() { return static_cast<net::default_multiplexer&>(system().middleman().backend()); }
  std::shared_ptr<tls::context> ctx_;
};

}  // namespace

node_links_scope::node_links_scope(caf::actor_system& sys, std::shared_ptr<tls::context> ctx) : sys_(sys) {
  auto basp = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  links_ = sys.spawn<links_actor, caf::detached + caf::hidden>(basp, std::move(ctx));
  sys.registry().put(links_key, links_);
}

node_links_scope::~node_links_scope() {
  sys_.registry().erase(links_key);
  caf::anon_send_exit(links_, caf::exit_reason::user_shutdown);
}

caf::io::middleman_actor node_links(caf::actor_system& sys) {
  if (auto links = sys.registry().get<caf::strong_actor_ptr>(links_key))
    return caf::actor_cast<caf::io::middleman_actor>(links);
  return sys.middleman().actor_handle();
}

caf::expected<uint16_t> publish_agent(caf::actor_system& sys, const caf::actor& agent, uint16_t port,
                                      const std::string& host) {
  caf::scoped_actor self{sys};
  caf::expected<uint16_t> bound{caf::sec::cannot_open_port};
  self->request(node_links(sys), caf::infinite, caf::publish_atom_v, port, caf::actor_cast<caf::strong_actor_ptr>(agent),
                std::set<std::string>{}, host, true)
      .receive([&](uint16_t p) { bound = p; }, [&](caf::error& e) { bound = std::move(e); });
  return bound;
}

}  // namespace troupe
