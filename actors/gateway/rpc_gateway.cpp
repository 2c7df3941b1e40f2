#include "actors/gateway/rpc_gateway.hpp"

#include <future>

#include "actors/caf/type_ids.hpp"
#include "actors/gateway/rpc_gateway_impl.hpp"

namespace troupe {

namespace {

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
      auto accepting = serve_connections(*receiver, srv, g->api_keys, io.provider->getTimer(), limits, *g->metrics)
                           .eagerlyEvaluate([](kj::Exception&&) {});
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
