#include "actors/gateway/gateway_metrics.hpp"

#include <cstdio>

namespace troupe {

void histogram::add(double seconds) {
  size_t i = 0;
  while (i < bounds.size() && seconds > bounds[i]) ++i;
  ++counts[i];
  sum += seconds;
  ++n;
}

void histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t acc = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    acc += counts[i];
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", bounds[i]);
    out += name + "_bucket{le=\"" + buf + "\"} " + std::to_string(acc) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(n) + "\n";
  out += name + "_sum " + std::to_string(sum) + "\n" + name + "_count " + std::to_string(n) + "\n";
}

std::string request_outcome(finish_reason r, const std::string& error, wire::error_kind kind, bool timed_out) {
  if (!error.empty()) return kind == wire::error_kind::unavailable && !timed_out ? "unavailable" : "error";
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
  std::string out;
  out += "# HELP troupe_requests_total Completion requests (HTTP and Cap'n Proto) by outcome.\n# TYPE troupe_requests_total counter\n";
  for (const char* o : request_outcomes) {
    auto it = outcomes_.find(o);
    out += std::string("troupe_requests_total{outcome=\"") + o + "\"} " + std::to_string(it == outcomes_.end() ? 0 : it->second) + "\n";
  }
  out += "# HELP troupe_prompt_tokens_total Prompt tokens of finished requests.\n# TYPE troupe_prompt_tokens_total counter\n";
  out += "troupe_prompt_tokens_total " + std::to_string(tokens_in_) + "\n";
  out += "# HELP troupe_generated_tokens_total Generated tokens of finished requests.\n# TYPE troupe_generated_tokens_total counter\n";
  out += "troupe_generated_tokens_total " + std::to_string(tokens_out_) + "\n";
  out += "# HELP troupe_requests_running Requests in the running batch.\n# TYPE troupe_requests_running gauge\n";
  out += "troupe_requests_running " + std::to_string(st.running) + "\n";
  out += "# HELP troupe_requests_waiting Requests queued for the batch.\n# TYPE troupe_requests_waiting gauge\n";
  out += "troupe_requests_waiting " + std::to_string(st.waiting) + "\n";
  out += "# HELP troupe_kv_blocks KV blocks by state.\n# TYPE troupe_kv_blocks gauge\n";
  out += "troupe_kv_blocks{state=\"used\"} " + std::to_string(st.kv_used) + "\n";
  out += "troupe_kv_blocks{state=\"free\"} " + std::to_string(st.kv_free) + "\n";
  out += "# HELP troupe_connections_open Client connections each API holds (HTTP: those on a connection thread).\n"
         "# TYPE troupe_connections_open gauge\n";
  out += "troupe_connections_open{api=\"http\"} " + std::to_string(connections_open(api::http)) + "\n";
  out += "troupe_connections_open{api=\"capnp\"} " + std::to_string(connections_open(api::capnp)) + "\n";
  out += "# HELP troupe_connections_shed_total Client connections closed to make room for a newcomer (the endpoint at "
         "max_connections or out of descriptors): each the one that had waited longest for its request.\n"
         "# TYPE troupe_connections_shed_total counter\n";
  out += "troupe_connections_shed_total{api=\"http\"} " + std::to_string(connections_shed(api::http)) + "\n";
  out += "troupe_connections_shed_total{api=\"capnp\"} " + std::to_string(connections_shed(api::capnp)) + "\n";
  ttft_.write(out, "troupe_time_to_first_token_seconds", "Time from request to first token.");
  tpot_.write(out, "troupe_time_per_output_token_seconds", "Mean time per token after the first, per request.");
  itl_.write(out, "troupe_inter_token_latency_seconds", "Gaps between streamed chunks.");
  e2e_.write(out, "troupe_request_latency_seconds", "Time from request to its last token.");
  return out;
}

}  // namespace troupe
