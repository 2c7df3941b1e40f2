#include "actors/gateway/rpc_gateway.hpp"

#include <atomic>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <caf/all.hpp>
#include <capnp/ez-rpc.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/async.h>

#include "actors/caf/type_ids.hpp"
#include "actors/gateway/api_keys.hpp"
#include "actors/gateway/router_calls.hpp"
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

  impl(caf::actor_system& s, caf::actor rtr, std::vector<std::string> keys)
      : sys(s), router(std::move(rtr)), api_keys(std::move(keys)) {}
};

namespace {

class gateway_server final : public schema::Gateway::Server {
 public:
  explicit gateway_server(rpc_gateway::impl& g) : g_(g), tasks_(errors_) {}

  kj::Promise<void> generate(GenerateContext context) override {
    if (g_.draining) return KJ_EXCEPTION(OVERLOADED, "the gateway is draining: it takes no new requests");
    auto params = context.getParams();
    if (!key_allowed(g_.api_keys, params.getApiKey().cStr())) return KJ_EXCEPTION(FAILED, "missing or wrong API key");
    const uint64_t id = next_id_++;
    capnp::MallocMessageBuilder copy;
    copy.setRoot(params.getRequest());
    copy.getRoot<schema::GenerateRequest>().disownDelivered();  // only the router resubmits
    sinks_.emplace(id, params.getSink());
    caf::anon_send(g_.router, generate_atom_v, id, wire_message(wire_kind::none, wire::to_bytes(copy)), g_.sink_actor);
    context.getResults().setRequestId(id);
    return kj::READY_NOW;
  }

  kj::Promise<void> cancel(CancelContext context) override {
    if (!key_allowed(g_.api_keys, context.getParams().getApiKey().cStr())) return KJ_EXCEPTION(FAILED, "missing or wrong API key");
    const uint64_t id = context.getParams().getRequestId();
    const bool known = sinks_.count(id) > 0;
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
      auto req = it->second.chunkRequest();
      req.setChunk(chunk);
      tasks_.add(req.send());
    } else {
      auto result = (*f)->root<schema::GenerateResult>();
      auto it = sinks_.find(result.getRequestId());
      if (it == sinks_.end()) return;
      auto req = it->second.doneRequest();
      req.setResult(result);
      tasks_.add(req.send().ignoreResult());
      sinks_.erase(it);
    }
  }

  rpc_gateway::impl& g_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, schema::TokenSink::Client> sinks_;
  error_handler errors_;
  kj::TaskSet tasks_;
};

}  // namespace

rpc_gateway::rpc_gateway(caf::actor_system& sys, caf::actor router, std::vector<std::string> api_keys)
    : impl_(std::make_unique<impl>(sys, std::move(router), std::move(api_keys))) {
  impl_->sink_actor = sys.spawn(sink_behavior, impl_->events);
}

rpc_gateway::~rpc_gateway() {
  stop();
  caf::anon_send_exit(impl_->sink_actor, caf::exit_reason::user_shutdown);
}

expected<uint16_t> rpc_gateway::start(const std::string& host, uint16_t port) {
  std::promise<expected<uint16_t>> ready;
  auto started = ready.get_future();
  impl* g = impl_.get();
  g->thread = std::thread([g, host, port, ready = std::move(ready)]() mutable {
    try {
      auto server_obj = kj::heap<gateway_server>(*g);
      gateway_server& srv = *server_obj;
      capnp::EzRpcServer server(kj::mv(server_obj), host + ":" + std::to_string(port), port, rpc_reader_options());
      auto& ws = server.getWaitScope();
      const uint16_t bound = static_cast<uint16_t>(server.getPort().wait(ws));
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
