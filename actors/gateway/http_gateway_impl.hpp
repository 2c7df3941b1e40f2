// http_gateway's inside, shared by its files: http_gateway.cpp (the server, its routes and
// the connection limits) and http_completions.cpp (the completion routes). Internal to
// actors/gateway.
#pragma once

#include <httplib.h>
#include <strings.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include <caf/all.hpp>

#include "actors/gateway/admission.hpp"
#include "actors/gateway/api_keys.hpp"
#include "actors/gateway/gateway_metrics.hpp"
#include "actors/gateway/http_connections.hpp"
#include "actors/gateway/http_gateway.hpp"

namespace troupe {

// The HTTP library's server with a listening queue of the system's length: the library
// listens with room for 5 connections not yet accepted, and a burst of clients beyond
// that has its connections dropped and retried a second later.
struct http_server final : httplib::Server {
  void widen_listen_queue() { ::listen(svr_sock_, SOMAXCONN); }
};

struct http_gateway::impl {
  caf::actor_system& sys;
  caf::actor router;
  http_config cfg;
  http_server server;
  std::thread thread;
  admission admit;  // completions in flight, against max_requests
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
      : sys(s), router(std::move(rtr)), cfg(std::move(c)), admit(cfg.max_requests),
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
  std::string render_status();
};

}  // namespace troupe
