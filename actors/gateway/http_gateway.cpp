#include "actors/gateway/http_gateway.hpp"
#include "actors/gateway/status_page.hpp"

#include <cctype>
#include <cstdio>

#include "actors/caf/type_ids.hpp"
#include "actors/gateway/http_gateway_impl.hpp"
#include "actors/gateway/router_calls.hpp"
#include "actors/tls/kj_tls.hpp"

namespace troupe {

namespace {

// The method a route takes ("" for no route).
std::string route_method(const std::string& path) {
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize" || path == "/detokenize")
    return "POST";
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0 || path == "/health" || path == "/metrics" ||
      path == "/status" || path == "/status.json")
    return "GET";
  return "";
}

}  // namespace

bool http_gateway::impl::tokenizer_for(const http::request& req, http::response& res) const {
  if (!authorized(req, res)) return false;
  if (cfg.tok) return true;
  send_error(res, {503, "this gateway has no tokenizer", "server_error", "", ""});
  return false;
}

// The model's tokenizer, as the completions routes use it: text to ids (BOS first unless
// add_special_tokens is false), and ids to text (BOS and EOS left out).
void http_gateway::impl::tokenize(const http::request& req, http::response& res) {
  if (!tokenizer_for(req, res)) return;
  auto parsed = openai::parse_tokenize(req.body, cfg.model_id, cfg.chat, cfg.limits);
  if (auto* e = std::get_if<openai::api_error>(&parsed)) return send_error(res, *e);
  const auto& t = std::get<openai::tokenize_request>(parsed);
  set_json(res, openai::tokenize_body(cfg.tok->encode(t.text, t.add_bos), cfg.limits.context));
}

void http_gateway::impl::detokenize(const http::request& req, http::response& res) {
  if (!tokenizer_for(req, res)) return;
  auto parsed = openai::parse_detokenize(req.body, cfg.model_id, cfg.tok->size());
  if (auto* e = std::get_if<openai::api_error>(&parsed)) return send_error(res, *e);
  std::vector<int32_t> ids;
  for (int32_t t : std::get<std::vector<int32_t>>(parsed))
    if (t != cfg.tok->bos_id() && t != cfg.tok->eos_id()) ids.push_back(t);
  set_json(res, openai::detokenize_body(cfg.tok->decode_all(ids)));
}

void http_gateway::impl::route(const std::shared_ptr<http::exchange>& ex, http::response& res) {
  const http::request& q = ex->req();
  const std::string& path = q.path;
  const std::string method = route_method(path);
  // A page from an allowed origin may read every answer; a preflight (OPTIONS) learns
  // what it may send. Without an allowed origin, OPTIONS still says the route's method.
  const std::string origin = q.header("Origin");
  const bool cors = !origin.empty() && (any_origin || std::find(cfg.cors_origins.begin(), cfg.cors_origins.end(), origin) !=
                                                          cfg.cors_origins.end());
  if (cors) {
    res.set("Access-Control-Allow-Origin", any_origin ? "*" : origin);
    if (!any_origin) res.set("Vary", "Origin");
  }
  if (method.empty()) return send_error(res, {404, "no such route", "invalid_request_error", "", ""});
  if (q.method == "OPTIONS") {
    res.status = 204;
    res.set("Allow", method + ", OPTIONS");
    if (cors) {
      res.set("Access-Control-Allow-Methods", method + ", OPTIONS");
      res.set("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set("Access-Control-Max-Age", "600");
    }
    return;
  }
  if (q.method != method) {
    res.set("Allow", method + ", OPTIONS");
    return send_error(res, {405, q.method + " is not allowed here; use " + method, "invalid_request_error", "", ""});
  }
  if (method == "POST") {
    // A POST says how long its body is, or sends it chunked.
    std::string coding = q.header("Transfer-Encoding");
    std::transform(coding.begin(), coding.end(), coding.begin(), [](unsigned char c) { return std::tolower(c); });
    if (!q.has("Content-Length") && coding.find("chunked") == std::string::npos)
      return send_error(res, {411, "a request body needs a Content-Length (or chunked encoding)", "invalid_request_error", "", ""});
    if (path == "/v1/completions" || path == "/v1/chat/completions") {
      if (!completions(ex, res, path == "/v1/chat/completions")) res.status = 0;  // answered later, by the request
      return;
    }
    if (path == "/tokenize") return tokenize(q, res);
    return detokenize(q, res);
  }
  if (path == "/health") {
    const router_health h = ask_health(sys, router, draining);
    res.status = h.ready ? 200 : 503;
    return set_json(res, openai::health_body(h.ready, h.replicas, h.replicas_ready, h.detail, h.outages, h.last_down_ms));
  }
  if (path == "/status") {
    // The status page: the page itself holds nothing (its figures come from /status.json,
    // behind the keys); it runs only its own script.
    res.set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                       "connect-src 'self'; img-src 'self'");
    res.set("X-Content-Type-Options", "nosniff");
    res.set("Content-Type", "text/html; charset=utf-8");
    res.body = status_page_html();
    return;
  }
  if (!authorized(q, res)) return;
  if (path == "/v1/models") return set_json(res, openai::models_body(cfg.model_id, started));
  if (path.rfind("/v1/models/", 0) == 0) {
    const std::string id = path.substr(11);
    if (id != cfg.model_id)
      return send_error(res, {404, "The model '" + id + "' does not exist; this server serves '" + cfg.model_id + "'",
                              "invalid_request_error", "model", "model_not_found"});
    return set_json(res, openai::model_body(cfg.model_id, started));
  }
  if (path == "/status.json") {
    res.set("Cache-Control", "no-store");
    return set_json(res, render_status());
  }
  res.set("Content-Type", "text/plain; version=0.0.4");
  res.body = render_metrics();
}

std::string http_gateway::impl::render_metrics() {
  const router_stats st = ask_stats(sys, router);
  caf::scoped_actor self{sys};
  std::string router_metrics;
  self->request(router, std::chrono::seconds(1), metrics_atom_v)
      .receive([&](const std::string& text) { router_metrics = text; }, [&](caf::error&) {});
  prometheus_text out;
  out.append(m->render(st));
  if (server) {
    const http::server_stats hs = server->stats();
    out.counter("troupe_http_slow_requests_total",
                "Connections answered 408 and closed for not sending a whole request within the read timeout",
                static_cast<double>(hs.timed_out));
    out.gauge("troupe_http_streams_open", "Streamed answers being written now", static_cast<double>(hs.streaming));
    out.gauge("troupe_http_threads", "The HTTP server's threads: one for every connection's I/O, the rest handle requests",
              static_cast<double>(hs.threads));
    if (cfg.tls)
      out.counter("troupe_http_tls_refused_total", "HTTPS connections whose TLS handshake failed or did not finish in time",
                  static_cast<double>(hs.refused_tls));
  }
  out.append(router_metrics);
  return out.str();
}

std::string http_gateway::impl::render_status() {
  caf::scoped_actor self{sys};
  std::string report;
  self->request(router, std::chrono::seconds(1), status_atom_v)
      .receive([&](const std::string& json) { report = json; }, [&](caf::error&) {});
  return status_json(cfg.model_id, report, m->figures(), cfg.layout);
}

http_gateway::http_gateway(caf::actor_system& sys, caf::actor router, http_config cfg)
    : impl_(std::make_unique<impl>(sys, std::move(router), std::move(cfg))) {}

http_gateway::~http_gateway() { stop(); }

int32_t connection_cap(const http_config& cfg) { return std::max(cfg.max_connections, cfg.max_requests + 32); }

expected<uint16_t> http_gateway::start() {
  impl* g = impl_.get();
  http::server_config sc;
  sc.host = g->cfg.host;
  sc.port = g->cfg.port;
  sc.max_connections = static_cast<size_t>(connection_cap(g->cfg));
  sc.max_body_bytes = g->cfg.max_body_bytes;
  sc.read_timeout = std::chrono::seconds(g->cfg.read_timeout_s);
  sc.idle_timeout = std::chrono::seconds(g->cfg.idle_timeout_s);
  sc.write_timeout = std::chrono::seconds(g->cfg.write_timeout_s);
  sc.max_stream_buffer = g->cfg.max_stream_buffer_bytes;
  sc.handler_threads = static_cast<size_t>(std::max(1, g->cfg.handler_threads));
  sc.tls = g->cfg.tls ? g->cfg.tls->get() : nullptr;
  sc.error_page = [](int status, const std::string& message, const std::string& code) {
    http::response r;
    impl::send_error(r, {status, message, "invalid_request_error", "", code});
    return r;
  };
  sc.log = [](const std::string& line) { std::fprintf(stderr, "troupe-http: %s\n", line.c_str()); };
  sc.on_connection = [m = g->m](int change) {
    if (change > 0)
      m->connection_opened(gateway_metrics::api::http);
    else if (change < 0)
      m->connection_closed(gateway_metrics::api::http);
    else
      m->connection_shed(gateway_metrics::api::http);
  };
  sc.on_slow_reader = [m = g->m] { m->slow_reader(gateway_metrics::api::http); };
  g->server = std::make_unique<http::server>(std::move(sc), [g](std::shared_ptr<http::exchange> ex) {
    http::response res;
    try {
      g->route(ex, res);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe-http: %s %s failed: %s\n", ex->req().method.c_str(), ex->req().path.c_str(), e.what());
      res = http::response{};
      impl::send_error(res, {500, "internal error", "server_error", "", ""});
    }
    if (res.status != 0) ex->respond(std::move(res));
  });
  return g->server->start();
}

void http_gateway::drain() { impl_->draining = true; }

void http_gateway::stop() {
  if (!impl_->server) return;
  impl_->server->stop(std::chrono::seconds(impl_->cfg.drain_timeout_s));
  impl_->server.reset();
}

}  // namespace troupe
