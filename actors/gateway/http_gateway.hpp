// http_gateway: the OpenAI-compatible HTTP API beside the Cap'n Proto one:
// POST /v1/completions and /v1/chat/completions (whole responses, or server-sent events
// ending with `data: [DONE]`), GET /v1/models, GET /health (200 only while a replica can
// serve: "ok", or "degraded" when some replica cannot), GET /metrics (Prometheus text). Bearer keys guard every route but /health
// when keys are configured; over capacity a request gets 429 with Retry-After at once.
// OPTIONS on a route answers 204 with the methods it takes; for a browser origin in
// cors_origins, every answer carries the CORS headers that let its pages call the API.
//
// The HTTP server (cpp-httplib, from Debian: small, threaded, chunked responses for
// SSE) serves each connection on a thread (http_connections: started as connections
// come, up to max_connections; a connection whose request has not arrived whole within
// read_timeout_s is answered 408 and closed, and so is the one that has waited longest
// for its request when every thread is busy and another connection comes); each request
// submits to the router actor with a sink actor of its own that queues the chunks for the
// request's thread.
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
  int32_t max_connections = 1024;        // served at once (a thread each); more wait their turn
                                         // (at least max_requests + 32: see connection_cap)
  int32_t read_timeout_s = 30;           // a request (head and body) must arrive within it, or 408
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
