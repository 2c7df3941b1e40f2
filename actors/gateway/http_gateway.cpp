#include "actors/gateway/http_gateway.hpp"
#include "actors/gateway/status_page.hpp"

#include <cctype>
#include <cstdio>

#include "actors/caf/type_ids.hpp"
#include "actors/gateway/http_gateway_impl.hpp"
#include "actors/gateway/router_calls.hpp"

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

// The connection threads as the HTTP library's task queue (the gateway holds them too,
// to release a listening thread waiting for one when it stops).
struct connection_queue final : httplib::TaskQueue {
  connection_queue(std::shared_ptr<connection_threads> t, std::shared_ptr<gateway_metrics> m)
      : threads(std::move(t)), metrics(std::move(m)) {}
  void enqueue(std::function<void()> fn) override {
    threads->enqueue([fn = std::move(fn), m = metrics] {
      m->connection_opened(gateway_metrics::api::http);
      fn();
      m->connection_closed(gateway_metrics::api::http);
    });
  }
  void shutdown() override { threads->shutdown(); }
  std::shared_ptr<connection_threads> threads;
  std::shared_ptr<gateway_metrics> metrics;
};

}  // namespace

bool http_gateway::impl::tokenizer_for(const httplib::Request& req, httplib::Response& res) const {
  if (!authorized(req, res)) return false;
  if (cfg.tok) return true;
  send_error(res, {503, "this gateway has no tokenizer", "server_error", "", ""});
  return false;
}

// The model's tokenizer, as the completions routes use it: text to ids (BOS first unless
// add_special_tokens is false), and ids to text (BOS and EOS left out).
void http_gateway::impl::tokenize(const httplib::Request& req, httplib::Response& res) {
  if (!tokenizer_for(req, res)) return;
  auto parsed = openai::parse_tokenize(req.body, cfg.model_id, cfg.chat, cfg.limits);
  if (auto* e = std::get_if<openai::api_error>(&parsed)) return send_error(res, *e);
  const auto& t = std::get<openai::tokenize_request>(parsed);
  res.set_content(openai::tokenize_body(cfg.tok->encode(t.text, t.add_bos), cfg.limits.context), "application/json");
}

void http_gateway::impl::detokenize(const httplib::Request& req, httplib::Response& res) {
  if (!tokenizer_for(req, res)) return;
  auto parsed = openai::parse_detokenize(req.body, cfg.model_id, cfg.tok->size());
  if (auto* e = std::get_if<openai::api_error>(&parsed)) return send_error(res, *e);
  std::vector<int32_t> ids;
  for (int32_t t : std::get<std::vector<int32_t>>(parsed))
    if (t != cfg.tok->bos_id() && t != cfg.tok->eos_id()) ids.push_back(t);
  res.set_content(openai::detokenize_body(cfg.tok->decode_all(ids)), "application/json");
}

void http_gateway::impl::post(const httplib::Request& req, httplib::Response& res) {
  if (req.path == "/v1/completions" || req.path == "/v1/chat/completions")
    completions(req, res, req.path == "/v1/chat/completions");
  else if (req.path == "/tokenize")
    tokenize(req, res);
  else if (req.path == "/detokenize")
    detokenize(req, res);
}

std::string http_gateway::impl::render_metrics() {
  const router_stats st = ask_stats(sys, router);
  caf::scoped_actor self{sys};
  std::string router_metrics;
  self->request(router, std::chrono::seconds(1), metrics_atom_v)
      .receive([&](const std::string& text) { router_metrics = text; }, [&](caf::error&) {});
  prometheus_text out;
  out.append(m->render(st));
  if (watch)
    out.counter("troupe_http_slow_requests_total",
                "Connections answered 408 and closed for not sending a whole request within the read timeout",
                static_cast<double>(watch->timed_out()));
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
  auto& srv = g->server;
  srv.set_payload_max_length(g->cfg.max_body_bytes);
  // A request in flight holds its connection's thread until it ends, and so does a
  // connection that has not sent its request yet; threads are started as connections
  // come, far beyond the admitted requests, so that a surplus request is refused at once
  // and idle connections do not crowd out working ones. A request that does not arrive
  // whole in time is cut off by the watch (below), and with every thread busy a newcomer
  // takes the place of the connection that has waited longest for its request.
  g->threads = std::make_shared<connection_threads>(static_cast<size_t>(connection_cap(g->cfg)), [g] {
    if (g->watch->shed(connection_watch::clock::now())) g->m->connection_shed(gateway_metrics::api::http);
  });
  srv.new_task_queue = [t = g->threads, m = g->m] { return new connection_queue(t, m); };
  // (The library's own limit is on each read, and answers 400 when it passes: it stays
  // behind the watch's, which answers 408 for the whole request.)
  srv.set_read_timeout(g->cfg.read_timeout_s + 5, 0);
  srv.set_write_timeout(30, 0);
  constexpr int keep_alive_s = 5;  // an idle connection is closed after it
  srv.set_keep_alive_timeout(keep_alive_s);
  srv.set_keep_alive_max_count(1000);  // requests on one connection (the library's default: 5)
  srv.set_logger([g](const httplib::Request& q, const httplib::Response&) {
    if (g->watch) g->watch->answered(q.remote_addr, q.remote_port);
  });
  // A declared body length is judged before any of the body is read: one that is not a
  // number, or that exceeds the limit, is answered at once (the library would read, or
  // wait up to its read timeout for, every byte declared). Whatever of the body follows
  // then fails to parse as the next request, which ends the connection; a client that
  // sends nothing more is dropped after the keep-alive timeout.
  srv.set_pre_routing_handler([g](const httplib::Request& q, httplib::Response& r) {
    // A page from an allowed origin may read every answer; a preflight (OPTIONS) learns
    // what it may send. Without an allowed origin, OPTIONS still says the route's method.
    const std::string origin = q.get_header_value("Origin");
    const auto& allowed = g->cfg.cors_origins;
    const bool cors = !origin.empty() && (g->any_origin || std::find(allowed.begin(), allowed.end(), origin) != allowed.end());
    if (cors) {
      r.set_header("Access-Control-Allow-Origin", g->any_origin ? "*" : origin);
      if (!g->any_origin) r.set_header("Vary", "Origin");
    }
    if (q.method == "OPTIONS") {
      const std::string m = route_method(q.path);
      if (m.empty()) return httplib::Server::HandlerResponse::Unhandled;  // no such route
      g->arrived(q);
      r.status = 204;
      r.set_header("Allow", m + ", OPTIONS");
      if (cors) {
        r.set_header("Access-Control-Allow-Methods", m + ", OPTIONS");
        r.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        r.set_header("Access-Control-Max-Age", "600");
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!q.has_header("Content-Length")) {
      // A POST says how long its body is, or sends it chunked (the library would answer a
      // bare "bad request").
      std::string coding = q.get_header_value("Transfer-Encoding");
      std::transform(coding.begin(), coding.end(), coding.begin(), [](unsigned char c) { return std::tolower(c); });
      if (q.method != "POST" || coding.find("chunked") != std::string::npos) return httplib::Server::HandlerResponse::Unhandled;
      g->arrived(q);
      impl::send_error(r, {411, "a request body needs a Content-Length (or chunked encoding)", "invalid_request_error", "", ""});
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::string len = q.get_header_value("Content-Length");
    const bool digits = !len.empty() && len.size() <= 19 && len.find_first_not_of("0123456789") == std::string::npos;
    if (digits && std::stoull(len) <= g->cfg.max_body_bytes) return httplib::Server::HandlerResponse::Unhandled;
    g->arrived(q);
    const int status = digits ? 413 : 400;
    impl::send_error(r, {status, digits ? "the request body is too large" : "Content-Length is not a length",
                         "invalid_request_error", "", ""});
    return httplib::Server::HandlerResponse::Handled;
  });
  // A route's handler runs once its request has arrived whole: the watch's deadline is met.
  auto arrived = [g](auto handler) {
    return [g, handler](const httplib::Request& q, httplib::Response& r) {
      g->arrived(q);
      handler(q, r);
    };
  };
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"})
    srv.Post(path, arrived([g](const httplib::Request& q, httplib::Response& r) { g->post(q, r); }));
  srv.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "troupe-http: handler failed: %s\n", what.c_str());
    r.status = 500;
    r.set_content(openai::error_body({500, "internal error", "server_error", "", ""}), "application/json");
  });
  srv.Get("/v1/models", arrived([g](const httplib::Request& q, httplib::Response& r) {
    if (!g->authorized(q, r)) return;
    r.set_content(openai::models_body(g->cfg.model_id, g->started), "application/json");
  }));
  srv.Get(R"(/v1/models/(.+))", arrived([g](const httplib::Request& q, httplib::Response& r) {
    if (!g->authorized(q, r)) return;
    const std::string id = q.matches[1];
    if (id != g->cfg.model_id)
      return impl::send_error(r, {404, "The model '" + id + "' does not exist; this server serves '" + g->cfg.model_id + "'",
                                  "invalid_request_error", "model", "model_not_found"});
    r.set_content(openai::model_body(g->cfg.model_id, g->started), "application/json");
  }));
  srv.Get("/health", arrived([g](const httplib::Request&, httplib::Response& r) {
    const router_health h = ask_health(g->sys, g->router, g->draining);
    r.status = h.ready ? 200 : 503;
    r.set_content(openai::health_body(h.ready, h.replicas, h.replicas_ready, h.detail, h.outages), "application/json");
  }));
  // The status page: the page itself holds nothing (its figures come from /status.json,
  // behind the keys); it runs only its own script.
  srv.Get("/status", arrived([](const httplib::Request&, httplib::Response& r) {
    r.set_header("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                            "connect-src 'self'; img-src 'self'");
    r.set_header("X-Content-Type-Options", "nosniff");
    r.set_content(status_page_html(), "text/html; charset=utf-8");
  }));
  srv.Get("/status.json", arrived([g](const httplib::Request& q, httplib::Response& r) {
    if (!g->authorized(q, r)) return;
    r.set_header("Cache-Control", "no-store");
    r.set_content(g->render_status(), "application/json");
  }));
  srv.Get("/metrics", arrived([g](const httplib::Request& q, httplib::Response& r) {
    if (!g->authorized(q, r)) return;
    r.set_content(g->render_metrics(), "text/plain; version=0.0.4");
  }));
  srv.set_error_handler([g](const httplib::Request& q, httplib::Response& r) {
    g->arrived(q);
    if (!r.body.empty()) return;
    const std::string method = route_method(q.path);
    const bool posts = method == "POST";
    // A request sent with a form's content type (what `curl -d` sends unless told
    // otherwise): the library refuses such bodies over 8 KiB, after reading them, with
    // 413. The body is the request's JSON all the same, within the gateway's own limit, so
    // it is served.
    if (r.status == 413 && posts && q.method == "POST" && q.body.size() <= g->cfg.max_body_bytes &&
        q.get_header_value("Content-Type").rfind("application/x-www-form-urlencoded", 0) == 0) {
      r.status = 200;
      return g->post(q, r);
    }
    std::string msg = r.status == 413 ? "the request body is too large" : r.status == 404 ? "no such route" : "bad request";
    // (The library fills in the peer only once it has read a request's head.)
    if (r.status == 400 && q.remote_addr.empty()) msg = "the request's head is not HTTP/1.1 (a request line, then headers)";
    // A route asked with the wrong method: 405, and the method it takes.
    if (r.status == 404 && !method.empty() && q.method != method) {
      r.status = 405;
      r.set_header("Allow", method + ", OPTIONS");
      msg = q.method + " is not allowed here; use " + method;
    }
    r.set_content(openai::error_body({r.status, msg, "invalid_request_error", "", ""}), "application/json");
  });
  int port = g->cfg.port;
  if (port == 0) {
    port = srv.bind_to_any_port(g->cfg.host.c_str());
    if (port < 0) return error{"http: cannot listen on " + g->cfg.host};
  } else if (!srv.bind_to_port(g->cfg.host.c_str(), port)) {
    return error{"http: cannot listen on " + g->cfg.host + ":" + std::to_string(port)};
  }
  srv.widen_listen_queue();
  g->watch = std::make_unique<connection_watch>(static_cast<uint16_t>(port), std::chrono::seconds(g->cfg.read_timeout_s),
                                                  std::chrono::seconds(keep_alive_s));
  g->watch->start();
  g->thread = std::thread([g] { g->server.listen_after_bind(); });
  return static_cast<uint16_t>(port);
}

void http_gateway::drain() { impl_->draining = true; }

void http_gateway::stop() {
  if (impl_->threads) impl_->threads->release();
  impl_->server.stop();
  // Connections waiting for a request would hold their threads, and the stop, until their
  // deadline: they are closed now.
  if (impl_->watch) impl_->watch->close_waiting();
  if (impl_->thread.joinable()) impl_->thread.join();
  if (impl_->watch) impl_->watch->stop();
}

}  // namespace troupe
