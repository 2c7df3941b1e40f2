#include "actors/gateway/rpc_gateway.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <future>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <caf/all.hpp>
#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <capnp/serialize.h>
#include <kj/async-io.h>
#include <kj/async.h>

#include "actors/caf/type_ids.hpp"
#include "actors/gateway/api_keys.hpp"
#include "actors/gateway/gateway_metrics.hpp"
#include "actors/gateway/router_calls.hpp"
#include "actors/wire/client_codec.hpp"
#include "actors/wire/frame.hpp"
#include "schema/client.capnp.h"

namespace troupe {

namespace {

// Events from the CAF side for the KJ thread: a TokenChunk or GenerateResult frame.
struct event {
  bool done = false;
  wire_message frame;
};

// A queue the CAF side pushes to and the KJ side drains; a push wakes the KJ thread
// through a cross-thread fulfiller the KJ side leaves when it waits.
class bridge {
 public:
  void push(event e) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(e));
    if (waiting_) {
      waiting_->fulfill();
      waiting_ = nullptr;
    }
  }
  // KJ thread only.
  kj::Promise<void> wait() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!q_.empty() || closed_) return kj::READY_NOW;
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    waiting_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }
  std::deque<event> drain() {
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<event> out;
    out.swap(q_);
    return out;
  }
  // KJ thread, at shutdown: no fulfiller may outlive the loop.
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    waiting_ = nullptr;
  }

 private:
  std::mutex mu_;
  std::deque<event> q_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiting_;
  bool closed_ = false;
};

struct sink_state {
  static inline const char* name = "troupe.gateway_sink";
  std::shared_ptr<bridge> b;
};

caf::behavior sink_behavior(caf::stateful_actor<sink_state>* self, std::shared_ptr<bridge> b) {
  self->state.b = std::move(b);
  return {
      [self](chunk_atom, const wire_message& m) { self->state.b->push({false, m}); },
      [self](done_atom, const wire_message& m) { self->state.b->push({true, m}); },
  };
}

capnp::ReaderOptions rpc_reader_options() {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = 1 << 20;  // a request of up to 8 MiB
  o.nestingLimit = 16;
  return o;
}

}  // namespace

struct rpc_gateway::impl {
  caf::actor_system& sys;
  caf::actor router;
  caf::actor sink_actor;
  std::shared_ptr<bridge> events = std::make_shared<bridge>();
  std::thread thread;
  std::mutex mu;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stopper;  // set by the KJ thread
  bool stopped = false;
  std::atomic<bool> draining{false};

  std::vector<std::string> api_keys;
  std::shared_ptr<gateway_metrics> metrics;

  impl(caf::actor_system& s, caf::actor rtr, std::vector<std::string> keys, std::shared_ptr<gateway_metrics> m)
      : sys(s), router(std::move(rtr)), api_keys(std::move(keys)),
        metrics(m ? std::move(m) : std::make_shared<gateway_metrics>()) {}
};

namespace {

class gateway_server final : public schema::Gateway::Server {
  struct request_sink {
    schema::TokenSink::Client sink;
    std::string api_key;  // the key it was made with
    request_times times;
    uint32_t output_tokens = 0;  // relayed so far
  };

 public:
  gateway_server(rpc_gateway::impl& g, const rpc_limits& limits)
      : g_(g), max_requests_(limits.max_requests), per_key_(limits.prefix_cache_per_key), tasks_(errors_) {}

  kj::Promise<void> generate(GenerateContext context) override {
    if (g_.draining) return KJ_EXCEPTION(OVERLOADED, "the gateway is draining: it takes no new requests");
    auto params = context.getParams();
    if (!key_allowed(g_.api_keys, params.getApiKey().cStr())) return KJ_EXCEPTION(FAILED, "missing or wrong API key");
    // Admission: past the requests in flight it takes, the gateway refuses at once (the
    // client may retry) rather than queue without bound.
    if (static_cast<int64_t>(sinks_.size()) >= max_requests_) {
      g_.metrics->refused("rejected");
      return kj::Exception(kj::Exception::Type::OVERLOADED, __FILE__, __LINE__,
                           kj::str("the gateway is at capacity: ", max_requests_, " requests in flight; retry shortly"));
    }
    const uint64_t id = next_id_++;
    capnp::MallocMessageBuilder copy;
    copy.setRoot(params.getRequest());
    copy.getRoot<schema::GenerateRequest>().disownDelivered();  // only the router resubmits
    copy.getRoot<schema::GenerateRequest>().setCacheNamespace(  // never the client's choice
        g_.api_keys.empty() ? 0 : cache_namespace_of(params.getApiKey().cStr(), per_key_));
    sinks_.emplace(id, request_sink{params.getSink(), params.getApiKey().cStr(), {}});
    caf::anon_send(g_.router, generate_atom_v, id, wire_message(wire_kind::none, wire::to_bytes(copy)), g_.sink_actor);
    context.getResults().setRequestId(id);
    return kj::READY_NOW;
  }

  kj::Promise<void> cancel(CancelContext context) override {
    if (!key_allowed(g_.api_keys, context.getParams().getApiKey().cStr())) return KJ_EXCEPTION(FAILED, "missing or wrong API key");
    // Only the key that made a request may cancel it (another client's request reads as
    // unknown).
    const uint64_t id = context.getParams().getRequestId();
    const auto it = sinks_.find(id);
    const bool known = it != sinks_.end() && same_key(it->second.api_key, context.getParams().getApiKey().cStr());
    if (known) caf::anon_send(g_.router, cancel_atom_v, id);
    context.getResults().setFound(known);
    return kj::READY_NOW;
  }

  kj::Promise<void> health(HealthContext context) override {
    const router_health r = ask_health(g_.sys, g_.router, g_.draining);
    auto h = context.getResults().initHealth();
    h.setReady(r.ready);
    h.setReplicas(r.replicas);
    h.setReplicasReady(r.replicas_ready);
    h.setOutages(r.outages);
    h.setDetail(r.detail);
    return kj::READY_NOW;
  }

  kj::Promise<void> stats(StatsContext context) override {
    if (!key_allowed(g_.api_keys, context.getParams().getApiKey().cStr())) return KJ_EXCEPTION(FAILED, "missing or wrong API key");
    const router_stats r = ask_stats(g_.sys, g_.router);
    auto s = context.getResults().initStats();
    s.setKvBlocksUsed(r.kv_used);
    s.setKvBlocksFree(r.kv_free);
    s.setRequestsRunning(r.running);
    s.setRequestsWaiting(r.waiting);
    return kj::READY_NOW;
  }

  // Forwards queued chunks and results to their sinks, forever.
  kj::Promise<void> pump() {
    return g_.events->wait().then([this]() {
      for (event& e : g_.events->drain()) forward(e);
      return pump();
    });
  }

 private:
  struct error_handler final : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}  // a client that went away
  };

  void forward(const event& e) {
    if (!e.frame.bytes) return;
    wire::frame_limits lim;
    lim.max_bytes = size_t{1} << 24;
    lim.traversal_words = size_t{1} << 22;
    auto f = wire::frame_reader::parse(*e.frame.bytes, lim);
    if (!f) return;
    if (!e.done) {
      auto chunk = (*f)->root<schema::TokenChunk>();
      auto it = sinks_.find(chunk.getRequestId());
      if (it == sinks_.end()) return;
      request_sink& r = it->second;
      g_.metrics->chunk(r.times);
      r.output_tokens += chunk.getTokens().size();
      auto req = r.sink.chunkRequest();
      req.setChunk(chunk);
      // A chunk that cannot be delivered (the client has gone) ends its request: the
      // replica stops generating for no one.
      tasks_.add(req.send().catch_([this, id = chunk.getRequestId()](kj::Exception&&) { client_gone(id); }));
    } else {
      auto result = (*f)->root<schema::GenerateResult>();
      auto it = sinks_.find(result.getRequestId());
      if (it == sinks_.end()) return;
      if (auto v = wire::read_generate_result(result))
        g_.metrics->finished(request_outcome(v->reason, v->error, v->error_type, false), v->prompt_tokens,
                             v->output_tokens, it->second.times);
      auto req = it->second.sink.doneRequest();
      req.setResult(result);
      tasks_.add(req.send().ignoreResult());
      sinks_.erase(it);
    }
  }

  void client_gone(uint64_t id) {
    auto it = sinks_.find(id);
    if (it == sinks_.end()) return;
    g_.metrics->finished("cancelled", 0, it->second.output_tokens, it->second.times);
    sinks_.erase(it);
    caf::anon_send(g_.router, cancel_atom_v, id);
  }

  rpc_gateway::impl& g_;
  const int32_t max_requests_;
  const bool per_key_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, request_sink> sinks_;
  error_handler errors_;
  kj::TaskSet tasks_;
};

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
                 connection_book& b)
      : book(b),
        gateway(g),
        api_keys(keys),
        stream(kj::mv(s)),
        network(*stream, capnp::rpc::twoparty::Side::SERVER, rpc_reader_options()),
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
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;  // last: its capabilities go first
};

// The gateway as one connection sees it: each call goes to the one gateway, after telling
// the connection which key it carried.
class connection_gateway final : public schema::Gateway::Server {
 public:
  explicit connection_gateway(rpc_connection& c) : c_(c) {}

  kj::Promise<void> generate(GenerateContext context) override {
    c_.called_with(context.getParams().getApiKey().cStr());
    return c_.gateway.generate(context);
  }
  kj::Promise<void> cancel(CancelContext context) override {
    c_.called_with(context.getParams().getApiKey().cStr());
    return c_.gateway.cancel(context);
  }
  kj::Promise<void> health(HealthContext context) override {
    if (c_.api_keys.empty()) c_.leave_waiting();
    return c_.gateway.health(context);
  }
  kj::Promise<void> stats(StatsContext context) override {
    c_.called_with(context.getParams().getApiKey().cStr());
    return c_.gateway.stats(context);
  }

 private:
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
  void admit(kj::Own<kj::AsyncIoStream>&& stream) {
    if (book_.live >= limits_.max_connections && !evict_oldest_waiting()) {
      note(refused, "refused a connection: " + std::to_string(book_.live) +
           " are open (max_connections), every one a client that has made a call");
      return;  // closed as it goes
    }
    auto c = kj::heap<rpc_connection>(kj::mv(stream), gateway_, api_keys_, book_);
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
  uint64_t unreported_[note_kinds] = {};
  std::chrono::steady_clock::time_point last_report_[note_kinds] = {};
  kj::TaskSet tasks_;  // last: its connections go first
};

}  // namespace

rpc_gateway::rpc_gateway(caf::actor_system& sys, caf::actor router, std::vector<std::string> api_keys,
                         std::shared_ptr<gateway_metrics> metrics)
    : impl_(std::make_unique<impl>(sys, std::move(router), std::move(api_keys), std::move(metrics))) {
  impl_->sink_actor = sys.spawn(sink_behavior, impl_->events);
}

rpc_gateway::~rpc_gateway() {
  stop();
  caf::anon_send_exit(impl_->sink_actor, caf::exit_reason::user_shutdown);
}

expected<uint16_t> rpc_gateway::start(const std::string& host, uint16_t port, rpc_limits limits) {
  std::promise<expected<uint16_t>> ready;
  auto started = ready.get_future();
  impl* g = impl_.get();
  g->thread = std::thread([g, host, port, limits, ready = std::move(ready)]() mutable {
    try {
      auto io = kj::setupAsyncIo();
      auto& ws = io.waitScope;
      auto server_obj = kj::heap<gateway_server>(*g, limits);
      gateway_server& srv = *server_obj;
      capnp::Capability::Client owner(kj::mv(server_obj));  // keeps the one gateway
      auto address = io.provider->getNetwork().parseAddress(host, port).wait(ws);
      auto receiver = address->listen();
      const auto bound = static_cast<uint16_t>(receiver->getPort());
      rpc_listener listener(*receiver, srv, g->api_keys, io.provider->getTimer(), limits, *g->metrics);
      auto accepting = listener.accept_loop().eagerlyEvaluate([](kj::Exception&&) {});
      auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
      {
        std::lock_guard<std::mutex> lock(g->mu);
        g->stopper = kj::mv(stop.fulfiller);
        if (g->stopped) g->stopper->fulfill();
      }
      ready.set_value(bound);
      auto pumping = srv.pump().eagerlyEvaluate([](kj::Exception&&) {});
      stop.promise.wait(ws);
      g->events->close();
      std::lock_guard<std::mutex> lock(g->mu);
      g->stopper = nullptr;
    } catch (const kj::Exception& e) {
      try {
        ready.set_value(error{std::string("gateway: ") + e.getDescription().cStr()});
      } catch (const std::future_error&) {
      }
    }
  });
  auto result = started.get();
  if (!result) {
    g->thread.join();
    return result;
  }
  return result;
}

void rpc_gateway::drain() { impl_->draining = true; }

void rpc_gateway::stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped && !impl_->thread.joinable()) return;
    impl_->stopped = true;
    if (impl_->stopper) impl_->stopper->fulfill();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace troupe
