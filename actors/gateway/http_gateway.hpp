// http_gateway: the OpenAI-compatible HTTP API beside the Cap'n Proto one:
// POST /v1/completions and /v1/chat/completions (whole responses, or server-sent events
// ending with `data: [DONE]`), GET /v1/models, GET /health (200 only while a replica can
// serve: "ok", or "degraded" when some replica cannot), GET /metrics (Prometheus text). Bearer keys guard every route but /health
// when keys are configured; over capacity a request gets 429 with Retry-After at once.
// OPTIONS on a route answers 204 with the methods it takes; for a browser origin in
// cors_origins, every answer carries the CORS headers that let its pages call the API.
//
// The HTTP server (http_server.hpp: event-driven, Boost.Asio and Beast) holds every
// connection on one I/O thread and runs the routes on a few handler threads; a completion
// submits to the router actor with a sink actor of its own, which answers, or writes the
// stream's events, as the router's chunks arrive. Connections, slow clients and slow
// readers are the server's to bound: see http_server.hpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/gateway/openai.hpp"
#include "actors/gateway/status_page.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

namespace tls {
class endpoint_context;
}

class gateway_metrics;

struct http_config {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;                  // 0: any free port
  std::string model_id;                  // the name clients pass as "model"
  openai::chat_template chat = openai::chat_template::raw;
  openai::api_limits limits;
  size_t max_body_bytes = size_t{1} << 20;  // larger bodies get 413
  int32_t max_requests = 64;             // in flight; more get 429
  int32_t request_timeout_s = 600;       // a request that takes longer ends with an error
  int32_t max_connections = 16384;       // held at once; a newcomer past them takes the place of
                                         // the one waiting longest for its request (at least
                                         // max_requests + 32: see connection_cap)
  int32_t read_timeout_s = 30;           // a request (head and body) must arrive within it, or 408
  int32_t idle_timeout_s = 60;           // a keep-alive connection unused this long is closed
  int32_t write_timeout_s = 30;          // a client that takes none of its answer this long is gone
  size_t max_stream_buffer_bytes = size_t{1} << 20;  // a stream's reader this far behind is gone
  int32_t handler_threads = 4;           // run the routes (the I/O has a thread of its own)
  int32_t drain_timeout_s = 10;          // on stop, answers in flight get this long to finish
  std::shared_ptr<const tls::endpoint_context> tls;  // HTTPS, where set
  uint32_t gateway = 0;                  // which of the deployment's gateways (its request ids)
  std::vector<std::string> api_keys;     // empty: no authentication
  bool prefix_cache_per_key = true;      // each key's requests in a prefix-cache namespace of their own
  std::vector<std::string> cors_origins;  // browser origins answered with CORS headers ("*": any)
  const tokenizer* tok = nullptr;        // token texts in log-probability listings
  std::shared_ptr<gateway_metrics> metrics;  // what /metrics counts (none: the gateway's own)
  std::vector<replica_layout> layout;    // the deployment's replicas and their stages, for
                                         // the status page
};

// The connections served at once: max_connections, and never fewer than the requests
// admitted plus room to refuse more with a 429.
int32_t connection_cap(const http_config& cfg);

class http_gateway {
 public:
  http_gateway(caf::actor_system& sys, caf::actor router, http_config cfg);
  ~http_gateway();
  http_gateway(const http_gateway&) = delete;
  http_gateway& operator=(const http_gateway&) = delete;

  expected<uint16_t> start();
  void drain();  // new completions get 503; those in flight finish
  void stop();

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
