#include "actors/gateway/gateway_metrics.hpp"


namespace troupe {

std::string request_outcome(finish_reason r, const std::string& error, error_code kind, bool timed_out) {
  if (!error.empty()) {
    if (timed_out) return "error";
    if (kind == error_code::unavailable) return "unavailable";
    return kind == error_code::invalid ? "invalid" : "error";  // (refused by the scheduler: a 400)
  }
  switch (r) {
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::aborted: return "cancelled";
    default: return "error";
  }
}

void gateway_metrics::refused(const char* outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  ++outcomes_[outcome];
}

namespace {
using seconds = std::chrono::duration<double>;
}  // namespace

void gateway_metrics::chunk(request_times& t) {
  const auto now = request_times::clock::now();
  if (t.first == request_times::clock::time_point{}) t.first = now;
  if (t.last != request_times::clock::time_point{}) {
    std::lock_guard<std::mutex> lock(mu_);
    itl_.add(seconds(now - t.last).count());
  }
  t.last = now;
}

void gateway_metrics::finished(const std::string& outcome, uint32_t prompt_tokens, uint32_t output_tokens,
                               const request_times& t) {
  const auto now = request_times::clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  ++outcomes_[outcome];
  tokens_in_ += prompt_tokens;
  tokens_out_ += output_tokens;
  if (t.first != request_times::clock::time_point{}) {
    ttft_.add(seconds(t.first - t.start).count());
    if (output_tokens > 1) tpot_.add(seconds(t.last - t.first).count() / (output_tokens - 1));
  }
  e2e_.add(seconds(now - t.start).count());
}

std::string gateway_metrics::render(const router_stats& st) const {
  std::lock_guard<std::mutex> lock(mu_);
  prometheus_text out;
  out.family("troupe_requests_total", "Completion requests (HTTP and Cap'n Proto) by outcome.", "counter");
  for (const char* o : request_outcomes) {
    auto it = outcomes_.find(o);
    out.sample("troupe_requests_total", {{"outcome", o}}, static_cast<double>(it == outcomes_.end() ? 0 : it->second));
  }
  out.counter("troupe_prompt_tokens_total", "Prompt tokens of finished requests.", static_cast<double>(tokens_in_));
  out.counter("troupe_generated_tokens_total", "Generated tokens of finished requests.", static_cast<double>(tokens_out_));
  out.gauge("troupe_requests_running", "Requests in the running batch.", st.running);
  out.gauge("troupe_requests_waiting", "Requests queued for the batch.", st.waiting);
  out.family("troupe_kv_blocks", "KV blocks by state.", "gauge");
  out.sample("troupe_kv_blocks", {{"state", "used"}}, st.kv_used);
  out.sample("troupe_kv_blocks", {{"state", "free"}}, st.kv_free);
  out.family("troupe_connections_open", "Client connections each API holds.", "gauge");
  out.sample("troupe_connections_open", {{"api", "http"}}, static_cast<double>(connections_open(api::http)));
  out.sample("troupe_connections_open", {{"api", "capnp"}}, static_cast<double>(connections_open(api::capnp)));
  out.family("troupe_requests_in_flight", "Completions each API has admitted that have not ended.", "gauge");
  out.sample("troupe_requests_in_flight", {{"api", "http"}},
             static_cast<double>(connections_[index(api::http)].in_flight.load()));
  out.sample("troupe_requests_in_flight", {{"api", "capnp"}},
             static_cast<double>(connections_[index(api::capnp)].in_flight.load()));
  out.family("troupe_connections_shed_total",
             "Client connections closed to make room for a newcomer (the endpoint at max_connections or out of "
             "descriptors): each the one that had waited longest for its request.",
             "counter");
  out.sample("troupe_connections_shed_total", {{"api", "http"}}, static_cast<double>(connections_shed(api::http)));
  out.sample("troupe_connections_shed_total", {{"api", "capnp"}}, static_cast<double>(connections_shed(api::capnp)));
  out.family("troupe_slow_readers_total",
             "Streams ended, and their requests cancelled, for a client that took its tokens too slowly (1 MiB "
             "behind, or nothing taken for the write timeout).",
             "counter");
  out.sample("troupe_slow_readers_total", {{"api", "http"}}, static_cast<double>(slow_readers(api::http)));
  out.sample("troupe_slow_readers_total", {{"api", "capnp"}}, static_cast<double>(slow_readers(api::capnp)));
  out.histogram("troupe_time_to_first_token_seconds", "Time from request to first token.", ttft_);
  out.histogram("troupe_time_per_output_token_seconds", "Mean time per token after the first, per request.", tpot_);
  out.histogram("troupe_inter_token_latency_seconds", "Gaps between streamed chunks.", itl_);
  out.histogram("troupe_request_latency_seconds", "Time from request to its last token.", e2e_);
  return out.str();
}

gateway_figures gateway_metrics::figures() const {
  gateway_figures f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const char* o : request_outcomes) {
      auto it = outcomes_.find(o);
      f.outcomes[o] = it == outcomes_.end() ? 0 : it->second;
    }
    f.prompt_tokens = tokens_in_;
    f.output_tokens = tokens_out_;
    f.timed = ttft_.n;
    f.ttft_mean_s = ttft_.n ? ttft_.sum / static_cast<double>(ttft_.n) : 0.0;
    f.tpot_mean_s = tpot_.n ? tpot_.sum / static_cast<double>(tpot_.n) : 0.0;
  }
  f.http_open = connections_open(api::http);
  f.capnp_open = connections_open(api::capnp);
  return f;
}

}  // namespace troupe
