// troupe_client: a small library for programs that talk to a troupe gateway over Cap'n
// Proto RPC (schema/client.capnp): generate with streamed chunks, cancel, health, stats.
// It owns a KJ event loop and runs it in the calling thread; one thread uses a client.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/sched/request.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

struct client_chunk {
  uint64_t request = 0;
  uint32_t seq = 0;
  std::vector<int32_t> tokens;
  std::string text;
};

struct client_result {
  uint64_t request = 0;
  finish_reason reason = finish_reason::none;
  std::vector<int32_t> tokens;   // every chunk's tokens, in order
  std::string text;              // every chunk's text
  uint32_t chunks = 0;
  uint32_t prompt_tokens = 0;
  uint32_t output_tokens = 0;
  bool sequence_ok = true;       // chunks arrived numbered 0, 1, 2, ... without gaps
  std::string error;             // from the server, when reason is none
  uint32_t attempts = 0;         // gateways it was sent to (more than 1: failed over)
};

struct client_health {
  bool ready = false;
  std::string detail;
  uint32_t replicas = 0, replicas_ready = 0;
  uint64_t outages = 0;  // times a replica stopped being ready
  uint64_t last_down_ms = 0;  // when one last did, by the gateway's clock (Unix time, ms; 0: never)
};

struct client_stats {
  uint32_t running = 0, waiting = 0, kv_used = 0, kv_free = 0;
};

class troupe_client {
 public:
  // host:port or capnp://host:port, plain; capnps://host:port over TLS, the gateway's
  // certificate checked against ca_file (empty: $TROUPE_CA, else the system's CAs) and
  // the host. Several gateways of one deployment, separated by commas: calls go to the
  // first that answers, and a generation whose gateway is lost (its connection closed or
  // refused, or the gateway draining) goes on at the next with the tokens already
  // delivered, so the caller sees each token once. The connection is made lazily and
  // errors surface from the first call. api_key: sent with every call but health; empty
  // takes $TROUPE_API_KEY (if set).
  static std::unique_ptr<troupe_client> connect(const std::string& addresses, const std::string& api_key = "",
                                                const std::string& ca_file = "");
  ~troupe_client();
  size_t endpoints() const;

  // steps_include_prompt: max_tokens counts the prompt's tokens after BOS (troupe-run's -n).
  expected<client_result> generate(const std::string& prompt, const request_params& params,
                                   bool steps_include_prompt,
                                   const std::function<void(const client_chunk&)>& on_chunk = {});
  expected<bool> cancel(uint64_t request);
  expected<client_health> health();
  expected<client_stats> stats();

  struct impl;

 private:
  explicit troupe_client(std::unique_ptr<impl> i);
  template <class Call>
  auto at_any(Call&& call) -> decltype(call(std::declval<struct gateway_link&>()));
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
