// http_gateway's inside, shared by its files: http_gateway.cpp (the server and its routes)
// and http_completions.cpp (the completion routes). Internal to actors/gateway.
#pragma once

#include <strings.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>

#include <caf/all.hpp>

#include "actors/gateway/admission.hpp"
#include "actors/gateway/api_keys.hpp"
#include "actors/gateway/gateway_metrics.hpp"
#include "actors/gateway/http_gateway.hpp"
#include "actors/gateway/http_server.hpp"
#include "engine/serve/request_router.hpp"

namespace troupe {

struct http_gateway::impl {
  caf::actor_system& sys;
  caf::actor router;
  http_config cfg;
  std::unique_ptr<http::server> server;  // from start()
  std::shared_ptr<gateway_metrics> m;  // shared with the Cap'n Proto gateway
  admission admit;  // completions in flight, against max_requests (shown in m)
  std::atomic<bool> draining{false};
  // HTTP request ids live above the Cap'n Proto API's, through the same router, each
  // gateway's apart (request_id_base).
  std::atomic<uint64_t> next_id;
  int64_t started = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();

  // From the configuration: whether any origin may call, and the token ending a chat turn
  // besides EOS (ChatML's <|im_end|>), which ends a chat answer.
  bool any_origin = false;
  std::optional<int32_t> turn_end;

  impl(caf::actor_system& s, caf::actor rtr, http_config c)
      : sys(s),
        router(std::move(rtr)),
        cfg(std::move(c)),
        m(cfg.metrics ? cfg.metrics : std::make_shared<gateway_metrics>()),
        admit(cfg.max_requests, &m->in_flight(gateway_metrics::api::http)),
        next_id(request_id_base(1, cfg.gateway)) {
    any_origin = std::find(cfg.cors_origins.begin(), cfg.cors_origins.end(), "*") != cfg.cors_origins.end();
    if (cfg.tok) turn_end = openai::turn_end_token(cfg.chat, *cfg.tok);
  }

  // The bearer key a request carries ("" for none): "Authorization: Bearer KEY", the
  // scheme in any case (RFC 9110).
  static std::string key_of(const http::request& req) {
    const std::string h = req.header("Authorization");
    if (h.size() < 7 || strncasecmp(h.c_str(), "bearer ", 7) != 0) return {};
    const size_t b = h.find_first_not_of(' ', 7), e = h.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : h.substr(b, e + 1 - b);
  }
  // Whether the request may pass; if not, res holds the 401 that says why (never the key).
  bool authorized(const http::request& req, http::response& res) const {
    if (cfg.api_keys.empty()) return true;
    const std::string key = key_of(req);
    if (!key.empty() && key_allowed(cfg.api_keys, key)) return true;
    std::string why = "the API key is not one of this server's keys";
    if (!req.has("Authorization"))
      why = "no API key: send one as the header 'Authorization: Bearer KEY'";
    else if (key.empty())
      why = "the Authorization header must read 'Bearer KEY'";
    send_error(res, {401, why, "invalid_request_error", "", "invalid_api_key"});
    res.set("WWW-Authenticate", req.has("Authorization") ? "Bearer error=\"invalid_token\"" : "Bearer");
    return false;
  }

  static void send_error(http::response& res, const openai::api_error& e) {
    res.status = e.status;
    res.set("Content-Type", "application/json");
    res.body = openai::error_body(e);
  }
  static void set_json(http::response& res, std::string body) {
    res.set("Content-Type", "application/json");
    res.body = std::move(body);
  }

  // Every request, on one of the server's handler threads: the route's answer, in `res`
  // (which carries the CORS headers already), or for the completions an answer to come.
  void route(const std::shared_ptr<http::exchange>& ex, http::response& res);
  // The completion routes: whether they answered in res (a refusal), or will answer
  // through ex themselves.
  bool completions(const std::shared_ptr<http::exchange>& ex, http::response& res, bool chat);
  void tokenize(const http::request& req, http::response& res);
  void detokenize(const http::request& req, http::response& res);
  // Whether the request may use the tokenizer; if not, res holds why.
  bool tokenizer_for(const http::request& req, http::response& res) const;
  std::string render_metrics();
  std::string render_status();
};

}  // namespace troupe
