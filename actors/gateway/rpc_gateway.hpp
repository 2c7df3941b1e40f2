// rpc_gateway: the client API (schema/client.capnp Gateway) over Cap'n Proto RPC, beside
// the CAF actors. The RPC system runs on a thread of its own (KJ's event loop); a call
// becomes a message to the router actor, and the chunks it relays come back through
// a bridge actor that queues them and wakes the KJ thread, which forwards them to the
// client's TokenSink in order (streaming calls, so a slow client slows only itself). A
// client that goes away has its requests cancelled at the next chunk that cannot reach it.
//
// Lifecycle: constructed -> start() (listening; the port is known) -> stop() / destructor
// (the KJ thread closes every connection and exits). Methods are called from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "engine/util/expected.hpp"

namespace troupe {

namespace tls {
class endpoint_context;
}

class gateway_metrics;

struct rpc_limits {
  int32_t max_requests = 256;       // in flight; more are refused (OVERLOADED) at once
  int32_t max_connections = 1024;   // open at once; past it a newcomer takes the place of
                                    // the connection longest without a keyed call, if any
  int32_t greeting_timeout_s = 30;  // a connection that has not asked for the gateway by then is closed
  bool prefix_cache_per_key = true;  // each key's requests in a prefix-cache namespace of their own
  // The endpoint's certificate: clients speak TLS (capnps://), each handshake within 5 s
  // (null: plain TCP).
  std::shared_ptr<const tls::endpoint_context> tls;
  uint32_t gateway = 0;  // which of the deployment's gateways (its request ids)
};

class rpc_gateway {
 public:
  // api_keys: when not empty, every call but health must carry one of them. metrics: where
  // requests are counted (shared with the HTTP gateway's /metrics; none: its own).
  rpc_gateway(caf::actor_system& sys, caf::actor router, std::vector<std::string> api_keys = {},
              std::shared_ptr<gateway_metrics> metrics = nullptr);
  ~rpc_gateway();
  rpc_gateway(const rpc_gateway&) = delete;
  rpc_gateway& operator=(const rpc_gateway&) = delete;

  // Binds host:port (port 0: any free port) and serves; returns the port.
  expected<uint16_t> start(const std::string& host, uint16_t port, rpc_limits limits = {});
  void stop();
  // From now on generate() is refused ("draining"); requests in flight continue.
  void drain();

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
