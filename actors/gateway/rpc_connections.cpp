// Each client's RPC connection and the listener that admits and sheds them
// (rpc_gateway_impl.hpp).
#include <chrono>
#include <cstdio>
#include <list>

#include <sys/socket.h>

#include <capnp/rpc-twoparty.h>

#include "actors/gateway/api_keys.hpp"
#include "actors/gateway/rpc_gateway_impl.hpp"
#include "actors/gateway/rpc_message_guard.hpp"
#include "actors/tls/kj_tls.hpp"
#include "engine/util/link_stream.hpp"
#include "engine/util/tcp.hpp"

namespace troupe {

namespace {

struct rpc_connection;

// The connections a listener holds: how many, and those that have not yet made a call
// with a valid API key, oldest first (the ones to close when room is needed).
struct connection_book {
  int32_t live = 0;
  std::list<rpc_connection*> waiting;
  gateway_metrics& metrics;
};

// One client's connection: the RPC system over its stream, serving the gateway. The
// client's bootstrap request (its first message, as every client sends it) greets; a
// call with a valid API key (any call, where no keys are set) proves it a client, and
// until then it is among the connections closed first when room is needed. It counts
// itself in its listener's book for as long as it lives or until it is closed to make
// room (evict).
struct rpc_connection final : capnp::BootstrapFactory<capnp::rpc::twoparty::VatId> {
  rpc_connection(kj::Own<kj::AsyncIoStream>&& s, gateway_server& g, const std::vector<std::string>& keys,
                 connection_book& b, std::string peer_name, rate_limited_log& protocol_log)
      : book(b),
        gateway(g),
        api_keys(keys),
        peer(std::move(peer_name)),
        log(protocol_log),
        stream(kj::mv(s)),
        messages(*stream, peer, protocol_log),
        network(messages, capnp::rpc::twoparty::Side::SERVER, rpc_reader_options()),
        rpc(capnp::makeRpcServer(network, *this)) {
    ++book.live;
    book.metrics.connection_opened(gateway_metrics::api::capnp);
    place = book.waiting.insert(book.waiting.end(), this);
  }
  ~rpc_connection() {
    leave_waiting();
    uncount();
  }
  rpc_connection(const rpc_connection&) = delete;
  rpc_connection& operator=(const rpc_connection&) = delete;

  capnp::Capability::Client createFor(capnp::rpc::twoparty::VatId::Reader) override;

  // A call with this key came: a valid one (any, where no keys are set) proves the client.
  void called_with(std::string_view key) {
    if (waiting && key_allowed(api_keys, key)) leave_waiting();
  }
  void leave_waiting() {
    if (waiting) book.waiting.erase(place);
    waiting = false;
  }

  // Closes the connection (at the event loop's next turn) and gives up its place at once.
  void evict() {
    leave_waiting();
    uncount();
    book.metrics.connection_shed(gateway_metrics::api::capnp);
    closing.fulfiller->fulfill();
  }
  void uncount() {
    if (!counted) return;
    --book.live;
    book.metrics.connection_closed(gateway_metrics::api::capnp);
    counted = false;
  }

  connection_book& book;
  gateway_server& gateway;
  const std::vector<std::string>& api_keys;
  std::list<rpc_connection*>::iterator place;
  bool greeted = false;  // has asked for the gateway
  bool waiting = true;   // has made no call with a valid key yet
  bool counted = true;
  kj::PromiseFulfillerPair<void> closing = kj::newPromiseAndFulfiller<void>();
  std::string peer;       // "host:port", for the log
  rate_limited_log& log;  // the listener's lines about broken protocol
  kj::Own<kj::AsyncIoStream> stream;
  guarded_message_stream messages;  // what the client is told when it breaks the protocol
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;  // last: its capabilities go first
};

// The gateway as one connection sees it: each call goes to the one gateway, after telling
// the connection which key it carried. A call whose parameters the library cannot read (a
// pointer of the wrong kind, past the limits) is answered in troupe's words, the
// library's logged.
class connection_gateway final : public schema::Gateway::Server {
 public:
  explicit connection_gateway(rpc_connection& c) : c_(c) {}

  kj::Promise<void> generate(GenerateContext context) override {
    return guarded([&] {
      c_.called_with(context.getParams().getApiKey().cStr());
      return c_.gateway.generate(context);
    });
  }
  kj::Promise<void> cancel(CancelContext context) override {
    return guarded([&] {
      c_.called_with(context.getParams().getApiKey().cStr());
      return c_.gateway.cancel(context);
    });
  }
  kj::Promise<void> health(HealthContext context) override {
    if (c_.api_keys.empty()) c_.leave_waiting();
    return c_.gateway.health(context);
  }
  kj::Promise<void> stats(StatsContext context) override {
    return guarded([&] {
      c_.called_with(context.getParams().getApiKey().cStr());
      return c_.gateway.stats(context);
    });
  }

 private:
  template <class F>
  kj::Promise<void> guarded(F call) {
    try {
      return call();
    } catch (const kj::Exception& e) {
      c_.log("troupe-capnp: " + c_.peer + ": a call refused: " + std::string(e.getDescription().cStr()));
      return KJ_EXCEPTION(FAILED, "troupe-capnp: the call's parameters are not a request this gateway can read");
    }
  }

  rpc_connection& c_;
};

capnp::Capability::Client rpc_connection::createFor(capnp::rpc::twoparty::VatId::Reader) {
  greeted = true;
  return kj::heap<connection_gateway>(*this);
}

// Accepts connections for as long as it lives. A failed accept (the process out of file
// descriptors, say) is said and tried again shortly, rather than ending the listening as
// it would by itself. A connection that has not asked for the gateway within the greeting
// time is closed. When room is needed (max_connections open, or no descriptor left for
// a waiting connection) the connection that has waited longest without making a call
// with a valid API key is closed for it: a client calls in milliseconds, so that one is
// the likeliest to be idle, and neither a flood of idle connections nor one of
// connections that greet and wait, without a key, can hold every place. With every place
// held by proven clients, a newcomer is closed. Lines about any of this are printed at
// most every ten seconds, each kind.
class rpc_listener final : kj::TaskSet::ErrorHandler {
 public:
  rpc_listener(kj::ConnectionReceiver& listener, gateway_server& gateway, const std::vector<std::string>& api_keys,
               kj::Timer& timer, const rpc_limits& limits, gateway_metrics& metrics)
      : listener_(listener),
        gateway_(gateway),
        api_keys_(api_keys),
        timer_(timer),
        limits_(limits),
        book_{0, {}, metrics},
        tasks_(*this) {}

  kj::Promise<void> accept_loop() {
    // (The library may throw at once, when a connection is waiting but no descriptor is
    // left for it: evalNow makes that a failed promise like the others.)
    return kj::evalNow([this] { return listener_.accept(); })
        .then(
            [this](kj::Own<kj::AsyncIoStream>&& stream) {
              admit(kj::mv(stream));
              return accept_loop();
            },
            [this](kj::Exception&& e) {
              note(accept_failed, "cannot accept a connection (" + std::string(e.getDescription().cStr()) + "); trying again");
              // (Soon when a connection has been closed to free a descriptor.)
              const auto delay = evict_oldest_waiting() ? 1 * kj::MILLISECONDS : 100 * kj::MILLISECONDS;
              return timer_.afterDelay(delay).then([this] { return accept_loop(); });
            });
  }

 private:
  // Over TLS, a newcomer's handshake comes first, within link_handshake_ms; at most
  // max_connections handshakes at once (a flood of silent ones then costs newcomers, not
  // the connections already in), and each one refused is a line in the log.
  void admit(kj::Own<kj::AsyncIoStream>&& stream) {
    if (!limits_.tls) return admit_plain(kj::mv(stream));
    const std::string peer = peer_of(*stream);
    if (handshakes_ >= limits_.max_connections) {
      note(refused, "refused a connection: " + std::to_string(handshakes_) + " TLS handshakes under way");
      return;
    }
    ++handshakes_;
    auto deadline = timer_.afterDelay(link_handshake_ms * kj::MILLISECONDS).then([]() -> kj::Own<kj::AsyncIoStream> {
      throw kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                          kj::str("no TLS handshake within ", link_handshake_ms, " ms"));
    });
    tasks_.add(tls::accept_tls(*limits_.tls, kj::mv(stream))
                   .exclusiveJoin(kj::mv(deadline))
                   .then(
                       [this](kj::Own<kj::AsyncIoStream>&& s) {
                         --handshakes_;
                         admit_plain(kj::mv(s));
                       },
                       [this, peer](kj::Exception&& e) {
                         --handshakes_;
                         std::string why = e.getDescription().cStr();
                         if (why.rfind("TLS: ", 0) == 0) why = why.substr(5);
                         log_link_refusal("troupe-capnp: " + peer + ": " + handshake_outcome(why));
                       }));
  }

  // "host:port" of a connection's peer.
  static std::string peer_of(kj::AsyncIoStream& s) {
    sockaddr_storage a{};
    kj::uint len = sizeof a;
    try {
      s.getpeername(reinterpret_cast<sockaddr*>(&a), &len);
    } catch (const kj::Exception&) {
      return "?";
    }
    return tcp::address_text(a);
  }

  void admit_plain(kj::Own<kj::AsyncIoStream>&& stream) {
    if (book_.live >= limits_.max_connections && !evict_oldest_waiting()) {
      note(refused, "refused a connection: " + std::to_string(book_.live) +
           " are open (max_connections), every one a client that has made a call");
      return;  // closed as it goes
    }
    std::string peer = peer_of(*stream);
    auto c = kj::heap<rpc_connection>(kj::mv(stream), gateway_, api_keys_, book_, kj::mv(peer), protocol_log_);
    rpc_connection& conn = *c;
    auto greeting = timer_.afterDelay(limits_.greeting_timeout_s * kj::SECONDS).then([&conn]() -> kj::Promise<void> {
      if (conn.greeted) return kj::NEVER_DONE;
      return kj::READY_NOW;
    });
    auto closing = kj::mv(conn.closing.promise);
    tasks_.add(conn.network.onDisconnect().exclusiveJoin(kj::mv(greeting)).exclusiveJoin(kj::mv(closing)).attach(kj::mv(c)));
  }

  bool evict_oldest_waiting() {
    if (book_.waiting.empty()) return false;
    book_.waiting.front()->evict();
    note(made_room, "closed the connection that had waited longest without a call (with a valid API key), to make room");
    return true;
  }

  // Each kind of line on its own clock, so that a stream of one does not hide another.
  enum note_kind { accept_failed, refused, made_room, note_kinds };
  void note(note_kind kind, const std::string& what) {
    uint64_t& unreported = unreported_[kind];
    ++unreported;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_report_[kind] < std::chrono::seconds(10)) return;
    const std::string more = unreported > 1 ? " (" + std::to_string(unreported - 1) + " more since the last line)" : "";
    std::fprintf(stderr, "troupe-capnp: %s%s\n", what.c_str(), more.c_str());
    unreported = 0;
    last_report_[kind] = now;
  }

  void taskFailed(kj::Exception&&) override {}  // a client that went away

  kj::ConnectionReceiver& listener_;
  gateway_server& gateway_;
  const std::vector<std::string>& api_keys_;
  kj::Timer& timer_;
  const rpc_limits limits_;
  connection_book book_;
  int32_t handshakes_ = 0;  // TLS handshakes under way
  rate_limited_log protocol_log_;  // clients that broke the protocol (stderr)
  uint64_t unreported_[note_kinds] = {};
  std::chrono::steady_clock::time_point last_report_[note_kinds] = {};
  kj::TaskSet tasks_;  // last: its connections go first
};

}  // namespace

kj::Promise<void> serve_connections(kj::ConnectionReceiver& listener, gateway_server& gateway,
                                    const std::vector<std::string>& api_keys, kj::Timer& timer, const rpc_limits& limits,
                                    gateway_metrics& metrics) {
  auto l = kj::heap<rpc_listener>(listener, gateway, api_keys, timer, limits, metrics);
  auto loop = l->accept_loop();
  return loop.attach(kj::mv(l));
}

}  // namespace troupe
