// rpc_gateway's inside, shared by its files: rpc_gateway.cpp (the KJ thread, start and
// stop), rpc_gateway_server.cpp (the Gateway's calls, and the chunks and results they
// relay back) and rpc_connections.cpp (each client's connection, and the listener that
// admits and sheds them). Internal to actors/gateway.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>
#include <capnp/message.h>
#include <kj/async-io.h>
#include <kj/async.h>

#include "engine/serve/request_router.hpp"
#include "actors/caf/wire_message.hpp"
#include "actors/gateway/admission.hpp"
#include "actors/gateway/gateway_metrics.hpp"
#include "actors/gateway/rpc_gateway.hpp"
#include "schema/client.capnp.h"

namespace troupe {

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


// The one Gateway every connection's calls go to: admission, keys, the router's requests
// and their sinks. Runs on the KJ thread.
class gateway_server final : public schema::Gateway::Server {
 public:
  gateway_server(rpc_gateway::impl& g, const rpc_limits& limits)
      : g_(g), admit_(limits.max_requests, &g.metrics->in_flight(gateway_metrics::api::capnp)), per_key_(limits.prefix_cache_per_key),
        next_id_(request_id_base(0, limits.gateway) + 1), tasks_(errors_) {}

  kj::Promise<void> generate(GenerateContext context) override;
  kj::Promise<void> cancel(CancelContext context) override;
  kj::Promise<void> health(HealthContext context) override;
  kj::Promise<void> stats(StatsContext context) override;
  // Forwards queued chunks and results to their sinks, forever.
  kj::Promise<void> pump();

 private:
  struct request_sink {
    schema::TokenSink::Client sink;
    std::string api_key;  // the key it was made with
    admission::ticket place;
    request_times times;
    uint32_t output_tokens = 0;  // relayed so far
    size_t unacknowledged = 0;   // bytes of chunks sent whose calls have not returned
  };
  // A client whose chunk calls have not returned for this many bytes reads too slowly: its
  // request is cancelled (as HTTP's slow readers are), so it holds no more than this.
  static constexpr size_t max_unacknowledged = size_t{1} << 20;
  struct error_handler final : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}  // a client that went away
  };

  void forward(const event& e);
  void client_gone(uint64_t id);

  rpc_gateway::impl& g_;
  admission admit_;
  const bool per_key_;
  uint64_t next_id_;  // this gateway's part of the ids (request_id_base)
  std::unordered_map<uint64_t, request_sink> sinks_;
  error_handler errors_;
  kj::TaskSet tasks_;
};

// The reader limits of a client's RPC connection.
capnp::ReaderOptions rpc_reader_options();

// Accepts connections on `listener` and serves them, until the promise is dropped (which
// closes them): rpc_connections.cpp.
kj::Promise<void> serve_connections(kj::ConnectionReceiver& listener, gateway_server& gateway,
                                    const std::vector<std::string>& api_keys, kj::Timer& timer, const rpc_limits& limits,
                                    gateway_metrics& metrics);

}  // namespace troupe
