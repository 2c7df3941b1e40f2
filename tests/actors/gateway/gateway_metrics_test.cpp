#include "actors/gateway/gateway_metrics.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace troupe;

namespace {

// The value on the line of `out` that starts with `series` and a space ("" when none).
std::string value_of(const std::string& out, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const auto at = out.find(key);
  if (at == std::string::npos) return "";
  const auto from = at + key.size();
  return out.substr(from, out.find('\n', from) - from);
}

}  // namespace

TEST_CASE("gateway metrics: outcomes and tokens of both APIs' requests add up, refusals included") {
  gateway_metrics m;
  request_times t;
  m.finished("stop", 10, 5, t);
  m.finished("stop", 3, 2, t);
  m.finished("cancelled", 0, 1, t);
  m.refused("rejected");
  const std::string out = m.render({3, 7, 1, 2});
  CHECK(value_of(out, R"(troupe_requests_total{outcome="stop"})") == "2");
  CHECK(value_of(out, R"(troupe_requests_total{outcome="cancelled"})") == "1");
  CHECK(value_of(out, R"(troupe_requests_total{outcome="rejected"})") == "1");
  CHECK(value_of(out, R"(troupe_requests_total{outcome="error"})") == "0");
  CHECK(value_of(out, "troupe_prompt_tokens_total") == "13");
  CHECK(value_of(out, "troupe_generated_tokens_total") == "8");
  CHECK(value_of(out, R"(troupe_kv_blocks{state="used"})") == "3");
  CHECK(value_of(out, "troupe_requests_waiting") == "2");
}

TEST_CASE("gateway metrics: histogram buckets are cumulative, +Inf counting every observation") {
  histogram h;
  h.add(0.001);  // the first bucket
  h.add(0.3);    // le 0.5
  h.add(100);    // past the last bound
  prometheus_text text;
  text.histogram("x", "test", h);
  const std::string out = text.str();
  CHECK(value_of(out, R"(x_bucket{le="0.005"})") == "1");
  CHECK(value_of(out, R"(x_bucket{le="0.25"})") == "1");
  CHECK(value_of(out, R"(x_bucket{le="0.5"})") == "2");
  CHECK(value_of(out, R"(x_bucket{le="60"})") == "2");
  CHECK(value_of(out, R"(x_bucket{le="+Inf"})") == "3");
  CHECK(value_of(out, "x_count") == "3");
}

TEST_CASE("gateway metrics: each API's connections open now and closed to make room") {
  gateway_metrics m;
  using api = gateway_metrics::api;
  m.connection_opened(api::http);
  m.connection_opened(api::http);
  m.connection_opened(api::capnp);
  m.connection_closed(api::http);
  m.connection_shed(api::capnp);
  m.connection_closed(api::capnp);
  const std::string out = m.render({});
  CHECK(value_of(out, R"(troupe_connections_open{api="http"})") == "1");
  CHECK(value_of(out, R"(troupe_connections_open{api="capnp"})") == "0");
  CHECK(value_of(out, R"(troupe_connections_shed_total{api="http"})") == "0");
  CHECK(value_of(out, R"(troupe_connections_shed_total{api="capnp"})") == "1");
  CHECK(out.find("# TYPE troupe_connections_open gauge\n") != std::string::npos);
  CHECK(out.find("# TYPE troupe_connections_shed_total counter\n") != std::string::npos);
}

TEST_CASE("gateway metrics: a request's outcome by how it ended, refusals of the scheduler counted invalid") {
  CHECK(request_outcome(finish_reason::stop, "", error_code::internal, false) == "stop");
  CHECK(request_outcome(finish_reason::length, "", error_code::internal, false) == "length");
  CHECK(request_outcome(finish_reason::aborted, "", error_code::internal, false) == "cancelled");
  // A prompt past the context, a token id outside the vocabulary: the client's mistake.
  CHECK(request_outcome(finish_reason::none, "token id 99999 is outside the vocabulary", error_code::invalid, false) ==
        "invalid");
  CHECK(request_outcome(finish_reason::none, "no replica", error_code::unavailable, false) == "unavailable");
  CHECK(request_outcome(finish_reason::none, "a stage failed", error_code::internal, false) == "error");
  CHECK(request_outcome(finish_reason::none, "too slow", error_code::unavailable, true) == "error");  // the gateway's deadline
  // The figures the status page reads.
  gateway_metrics m;
  m.refused("invalid");
  request_times t;
  t.first = t.start + std::chrono::milliseconds(20);
  t.last = t.start + std::chrono::milliseconds(60);
  m.finished("length", 5, 9, t);
  const gateway_figures f = m.figures();
  CHECK(f.outcomes.at("invalid") == 1);
  CHECK(f.outcomes.at("length") == 1);
  CHECK(f.outcomes.at("error") == 0);
  CHECK(f.prompt_tokens == 5);
  CHECK(f.output_tokens == 9);
  CHECK(f.timed == 1);
  CHECK(f.ttft_mean_s == doctest::Approx(0.020).epsilon(0.01));
  CHECK(f.tpot_mean_s == doctest::Approx(0.005).epsilon(0.01));
}
