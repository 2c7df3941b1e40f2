// gateway_metrics: what the gateways count for /metrics (Prometheus text format):
// completion requests by outcome, prompt and generated tokens, and histograms of time to
// first token, time per output token, inter-token gaps and request latency, over the HTTP
// and the Cap'n Proto APIs together (one object, shared); and each API's client
// connections (open now, and closed to make room for others) and requests in flight. Safe to call from every HTTP
// worker and the RPC thread at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "actors/gateway/router_calls.hpp"
#include "actors/metrics/prometheus_text.hpp"
#include "actors/wire/client_codec.hpp"

namespace troupe {

// How a request that ran ended, as troupe_requests_total counts it (a client that left is
// counted apart, as cancelled; the gateway's own deadline passing is an error).
std::string request_outcome(finish_reason r, const std::string& error, error_code kind, bool timed_out);

// How a request ended, as troupe_requests_total's outcome label says it.
inline constexpr const char* request_outcomes[] = {"stop", "length", "cancelled", "error", "invalid", "rejected", "unavailable"};

// When a request arrived, and when its first and its latest chunks did (none yet: {}).
struct request_times {
  using clock = std::chrono::steady_clock;
  clock::time_point start = clock::now(), first{}, last{};
};

// The gateway's figures since it started, for the status page.
struct gateway_figures {
  std::map<std::string, uint64_t> outcomes;  // requests by troupe_requests_total's outcome
  uint64_t prompt_tokens = 0, output_tokens = 0;
  uint64_t timed = 0;                        // requests with a first token
  double ttft_mean_s = 0, tpot_mean_s = 0;
  int64_t http_open = 0, capnp_open = 0;     // client connections now
};

class gateway_metrics {
 public:
  // A request refused before it ran ("invalid", "rejected").
  void refused(const char* outcome);
  // A chunk of the request timed by t arrived now: its gap after the one before counts.
  void chunk(request_times& t);
  // A request that ran, ending now: time to first token and time per output token when it
  // produced tokens, and its whole time.
  void finished(const std::string& outcome, uint32_t prompt_tokens, uint32_t output_tokens, const request_times& t);
  // A client connection of an API opened, closed, or closed to make room for a newcomer
  // (counted as closed too).
  enum class api { http, capnp };
  void connection_opened(api a) { connections_[index(a)].open.fetch_add(1, std::memory_order_relaxed); }
  void connection_closed(api a) { connections_[index(a)].open.fetch_sub(1, std::memory_order_relaxed); }
  void connection_shed(api a) { connections_[index(a)].shed.fetch_add(1, std::memory_order_relaxed); }
  // A stream ended for a client that took its chunks too slowly.
  void slow_reader(api a) { connections_[index(a)].slow_readers.fetch_add(1, std::memory_order_relaxed); }
  uint64_t slow_readers(api a) const { return connections_[index(a)].slow_readers.load(); }
  int64_t connections_open(api a) const { return connections_[index(a)].open.load(); }
  // What each API's admission has let in and not yet released (completions): its
  // admission keeps this count (admission.hpp).
  std::atomic<int64_t>& in_flight(api a) { return connections_[index(a)].in_flight; }
  uint64_t connections_shed(api a) const { return connections_[index(a)].shed.load(); }

  // Everything, with the router's running, waiting and KV figures.
  std::string render(const router_stats& st) const;
  gateway_figures figures() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> outcomes_;
  uint64_t tokens_in_ = 0, tokens_out_ = 0;
  histogram ttft_, tpot_, itl_, e2e_;
  struct connection_counts {
    std::atomic<int64_t> open{0};
    std::atomic<uint64_t> shed{0};
    std::atomic<uint64_t> slow_readers{0};
    std::atomic<int64_t> in_flight{0};
  };
  static size_t index(api a) { return a == api::http ? 0 : 1; }
  connection_counts connections_[2];
};

}  // namespace troupe
