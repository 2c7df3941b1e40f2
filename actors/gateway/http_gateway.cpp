#include "actors/gateway/http_gateway.hpp"

#include <httplib.h>
#include <strings.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <numeric>
#include <thread>

#include <caf/all.hpp>

#include "actors/caf/type_ids.hpp"
#include "actors/gateway/api_keys.hpp"
#include "actors/gateway/http_connections.hpp"
#include "actors/gateway/gateway_metrics.hpp"
#include "actors/gateway/router_calls.hpp"
#include "actors/wire/client_codec.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;

// HTTP request ids live far above the Cap'n Proto gateway's, through the same router.
std::atomic<uint64_t> next_http_id{uint64_t{1} << 62};

struct stream_event {
  bool done = false;
  wire_message frame;
};

// Chunks of one HTTP request's completions, filled by its sink actor, drained by the
// request's thread.
struct request_stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<stream_event> q;

  void push(stream_event e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      q.push_back(std::move(e));
    }
    cv.notify_one();
  }
  std::optional<stream_event> pop(clock_type::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_until(lock, deadline, [&] { return !q.empty(); })) return std::nullopt;
    stream_event e = std::move(q.front());
    q.pop_front();
    return e;
  }
};

caf::behavior stream_sink(caf::event_based_actor*, std::shared_ptr<request_stream> s) {
  return {
      [s](chunk_atom, const wire_message& m) { s->push({false, m}); },
      [s](done_atom, const wire_message& m) { s->push({true, m}); },
  };
}

// The HTTP answer to a request that ended in an error: the request's own fault is a 400, no
// replica able to serve it in time a 503 (retry later), the server's fault a 500, and the
// gateway's own deadline passing a 504.
openai::api_error failure_of(const std::string& why, error_code kind, bool timed_out) {
  if (timed_out) return {504, why, "timeout_error", "", "timeout"};
  if (kind == error_code::invalid) return {400, why, "invalid_request_error", "", ""};
  if (kind == error_code::unavailable) return {503, why, "server_error", "", "unavailable"};
  return {500, why, "server_error", "", ""};
}

// The method a route takes ("" for no route).
std::string route_method(const std::string& path) {
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize" || path == "/detokenize")
    return "POST";
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0 || path == "/health" || path == "/metrics") return "GET";
  return "";
}

// The HTTP library's server with a listening queue of the system's length: the library
// listens with room for 5 connections not yet accepted, and a burst of clients beyond
// that has its connections dropped and retried a second later.
struct http_server final : httplib::Server {
  void widen_listen_queue() { ::listen(svr_sock_, SOMAXCONN); }
};

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

struct http_gateway::impl {
  caf::actor_system& sys;
  caf::actor router;
  http_config cfg;
  http_server server;
  std::thread thread;
  std::atomic<int32_t> in_flight{0};
  std::atomic<bool> draining{false};
  std::shared_ptr<gateway_metrics> m;  // shared with the Cap'n Proto gateway
  std::unique_ptr<connection_watch> watch;  // from start()
  std::shared_ptr<connection_threads> threads;  // from start()
  int64_t started = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();

  // From the configuration: whether any origin may call, and the token ending a chat turn
  // besides EOS (ChatML's <|im_end|>), which ends a chat answer.
  bool any_origin = false;
  std::optional<int32_t> turn_end;

  impl(caf::actor_system& s, caf::actor rtr, http_config c)
      : sys(s), router(std::move(rtr)), cfg(std::move(c)),
        m(cfg.metrics ? cfg.metrics : std::make_shared<gateway_metrics>()) {
    any_origin = std::find(cfg.cors_origins.begin(), cfg.cors_origins.end(), "*") != cfg.cors_origins.end();
    if (cfg.tok) turn_end = openai::turn_end_token(cfg.chat, *cfg.tok);
  }

  // The bearer key a request carries ("" for none): "Authorization: Bearer KEY", the
  // scheme in any case (RFC 9110).
  static std::string key_of(const httplib::Request& req) {
    const std::string h = req.get_header_value("Authorization");
    if (h.size() < 7 || strncasecmp(h.c_str(), "bearer ", 7) != 0) return {};
    const size_t b = h.find_first_not_of(' ', 7), e = h.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : h.substr(b, e + 1 - b);
  }
  // Whether the request may pass; if not, res holds the 401 that says why (never the key).
  bool authorized(const httplib::Request& req, httplib::Response& res) const {
    if (cfg.api_keys.empty()) return true;
    const std::string key = key_of(req);
    if (!key.empty() && key_allowed(cfg.api_keys, key)) return true;
    std::string why = "the API key is not one of this server's keys";
    if (!req.has_header("Authorization"))
      why = "no API key: send one as the header 'Authorization: Bearer KEY'";
    else if (key.empty())
      why = "the Authorization header must read 'Bearer KEY'";
    send_error(res, {401, why, "invalid_request_error", "", "invalid_api_key"});
    res.set_header("WWW-Authenticate", req.has_header("Authorization") ? "Bearer error=\"invalid_token\"" : "Bearer");
    return false;
  }

  static void send_error(httplib::Response& res, const openai::api_error& e) {
    res.status = e.status;
    res.set_content(openai::error_body(e), "application/json");
  }

  // The request has arrived whole (head and body): the slow-request deadline is met.
  void arrived(const httplib::Request& req) const {
    if (watch) watch->arrived(req.remote_addr, req.remote_port);
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool chat);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
  // Whether the request may use the tokenizer; if not, res holds why.
  bool tokenizer_for(const httplib::Request& req, httplib::Response& res) const;
  // A POST route's handler, by its path (none for an unknown path).
  void post(const httplib::Request& req, httplib::Response& res);
  std::string render_metrics();
};

void http_gateway::impl::completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  const auto t0 = clock_type::now();
  if (!authorized(req, res)) return;
  if (draining) return send_error(res, {503, "the server is shutting down", "server_error", "", ""});
  auto parsed = openai::parse_request(req.body, chat, cfg.model_id, cfg.chat, cfg.limits);
  if (auto* e = std::get_if<openai::api_error>(&parsed)) {
    m->refused("invalid");
    return send_error(res, *e);
  }
  auto r = std::get<openai::api_request>(std::move(parsed));
  if (chat && turn_end) r.params.stop_tokens.push_back(*turn_end);
  if (!cfg.api_keys.empty()) r.params.cache_namespace = cache_namespace_of(key_of(req), cfg.prefix_cache_per_key);
  // Admission: a full server answers at once. Every choice is a request of the engine's
  // and counts as one; a request with more than the server admits counts as all of it
  // (it is let in when nothing else is in flight).
  const int32_t weight = std::min(static_cast<int32_t>(r.prompts.size()) * r.n, cfg.max_requests);
  if (in_flight.fetch_add(weight) + weight > cfg.max_requests) {
    in_flight.fetch_sub(weight);
    m->refused("rejected");
    res.set_header("Retry-After", "1");
    return send_error(res, {429, "the server is at capacity; retry shortly", "rate_limit_error", "", "overloaded"});
  }
  auto stream = std::make_shared<request_stream>();
  auto sink = sys.spawn(stream_sink, stream);
  std::vector<uint64_t> ids;
  for (const auto& prompt : r.prompts)
    for (int32_t i = 0; i < r.n; ++i) {
      request_params p = r.params;
      p.sampling.seed += static_cast<uint64_t>(i);  // n different samples; a prompt's are the same in any company
      const uint64_t id = next_http_id++;
      ids.push_back(id);
      if (prompt.is_tokens) p.prompt = prompt.tokens;
      auto frame = prompt.is_tokens ? wire::encode_generate_request_tokens(p)
                                    : wire::encode_generate_request_text(prompt.text, p);
      caf::anon_send(router, generate_atom_v, id, wire_message(wire_kind::none, std::move(frame)), sink);
    }
  const std::string cid = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(ids[0]);
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const auto deadline = t0 + std::chrono::seconds(cfg.request_timeout_s);

  struct state {
    std::vector<openai::choice_result> choices;
    std::vector<bool> finished, started;
    // Per prompt (its choices share it): its tokens, and those the prefix cache served.
    std::vector<uint32_t> prompt_tokens_of, cached_tokens_of;
    uint32_t output_tokens = 0;
    uint32_t prompt_tokens() const { return std::accumulate(prompt_tokens_of.begin(), prompt_tokens_of.end(), 0u); }
    uint32_t cached_tokens() const { return std::accumulate(cached_tokens_of.begin(), cached_tokens_of.end(), 0u); }
    size_t done = 0;
    std::string error;
    error_code error_type = error_code::invalid;
    bool timed_out = false;    // the gateway's own deadline passed
    bool client_gone = false;  // a stream's client went away before its end
    request_times times;
  };
  auto st = std::make_shared<state>();
  st->times.start = t0;
  st->choices.resize(ids.size());
  st->finished.assign(ids.size(), false);
  st->started.assign(ids.size(), false);
  st->prompt_tokens_of.assign(r.prompts.size(), 0);
  st->cached_tokens_of.assign(r.prompts.size(), 0);
  auto index_of = [ids](uint64_t id) {
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == id) return static_cast<int>(i);
    return -1;
  };
  // Applies one event; returns the SSE payloads it produces (streaming).
  const openai::token_text text_of = [tok = cfg.tok](int32_t t) {
    return tok ? std::string(tok->decode(-1, t)) : std::to_string(t);
  };
  auto apply = [this, st, index_of, chat, cid, created, model = r.model, text_of, n = r.n](const stream_event& e,
                                                                                 std::vector<std::string>* sse) {
    if (e.done) {
      auto v = wire::decode_generate_result(*e.frame.bytes);
      if (!v) return;
      const int i = index_of(v->request);
      if (i < 0 || st->finished[i]) return;
      st->finished[i] = true;
      ++st->done;
      st->choices[i].reason = v->reason;
      st->prompt_tokens_of[i / n] = v->prompt_tokens;
      st->output_tokens += v->output_tokens;
      st->cached_tokens_of[i / n] = std::max(st->cached_tokens_of[i / n], v->cached_prompt_tokens);
      if (!v->error.empty() && st->error.empty()) {
        st->error = v->error;
        st->error_type = v->error_type;
      }
      if (sse && v->error.empty()) sse->push_back(openai::chunk_body(cid, chat, model, created, i, "", v->reason, !st->started[i]));
    } else {
      auto c = wire::decode_token_chunk(*e.frame.bytes);
      if (!c) return;
      const int i = index_of(c->request);
      if (i < 0) return;
      m->chunk(st->times);
      st->choices[i].text += c->text;
      st->choices[i].tokens.insert(st->choices[i].tokens.end(), c->tokens.begin(), c->tokens.end());
      st->choices[i].logprobs.insert(st->choices[i].logprobs.end(), c->logprobs.begin(), c->logprobs.end());
      if (sse && (!c->text.empty() || !c->logprobs.empty())) {
        sse->push_back(openai::chunk_body(cid, chat, model, created, i, c->text, std::nullopt, !st->started[i],
                                          &c->logprobs, text_of));
        st->started[i] = true;
      }
    }
  };
  auto finish_metrics = [this, st]() {
    m->finished(st->client_gone ? "cancelled" : request_outcome(st->choices[0].reason, st->error, st->error_type, st->timed_out),
                st->prompt_tokens(), st->output_tokens, st->times);
  };
  auto cancel_all = [this, ids, st]() {
    for (size_t i = 0; i < ids.size(); ++i)
      if (!st->finished[i]) caf::anon_send(router, cancel_atom_v, ids[i]);
  };
  // The gateway's deadline passed: what is still running is cancelled.
  auto time_out = [this, st, cancel_all]() {
    cancel_all();
    st->error = "the request took longer than " + std::to_string(cfg.request_timeout_s) + " s";
    st->timed_out = true;
  };

  if (!r.stream) {
    // A whole answer: the connection is not read meanwhile, so the watch says whether the
    // client has left (looked at every quarter second); if it has, the requests end.
    auto next_look = clock_type::now();
    while (st->done < ids.size()) {
      if (auto e = stream->pop(std::min(deadline, next_look + std::chrono::milliseconds(250)))) apply(*e, nullptr);
      const auto now = clock_type::now();
      if (st->done == ids.size()) break;
      if (now >= deadline) {
        time_out();
        break;
      }
      if (now >= next_look + std::chrono::milliseconds(250)) {
        next_look = now;
        if (watch && watch->gone(req.remote_addr, req.remote_port)) {
          cancel_all();
          st->client_gone = true;
          break;
        }
      }
    }
    caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
    finish_metrics();
    in_flight.fetch_sub(weight);
    if (!st->error.empty()) {
      const openai::api_error e = failure_of(st->error, st->error_type, st->timed_out);
      if (e.status == 503) res.set_header("Retry-After", "1");
      return send_error(res, e);
    }
    res.set_content(openai::completion_body(cid, chat, r.model, created, st->choices, st->prompt_tokens(),
                                            st->output_tokens, st->cached_tokens(), r.logprobs, text_of),
                    "application/json");
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream, st, apply, ids, deadline, cancel_all, time_out, include_usage = r.include_usage, chat, cid, created,
       model = r.model](size_t, httplib::DataSink& out) {
        auto write = [&](const std::string& payload) {
          const std::string line = "data: " + payload + "\n\n";
          return out.write(line.data(), line.size());
        };
        auto e = stream->pop(deadline);
        if (!e) {
          time_out();
          write(openai::error_body(failure_of(st->error, st->error_type, st->timed_out)));
          write("[DONE]");
          out.done();
          return true;
        }
        std::vector<std::string> sse;
        apply(*e, &sse);
        for (const auto& p : sse)
          if (!write(p)) {  // the client went away: stop generating
            cancel_all();
            return false;
          }
        if (st->done == ids.size()) {
          if (!st->error.empty()) write(openai::error_body(failure_of(st->error, st->error_type, st->timed_out)));
          if (include_usage)
            write(openai::usage_chunk_body(cid, chat, model, created, st->prompt_tokens(), st->output_tokens, st->cached_tokens()));
          write("[DONE]");
          out.done();
        }
        return true;
      },
      [this, sink, st, finish_metrics, cancel_all, n = ids.size(), weight](bool) {
        st->client_gone = st->done < n && !st->timed_out;  // the stream ended before its requests did
        cancel_all();  // no-op for finished choices
        caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
        finish_metrics();
        in_flight.fetch_sub(weight);
      });
}

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
