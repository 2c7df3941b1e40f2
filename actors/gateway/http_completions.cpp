// The completion routes of the HTTP gateway: /v1/completions and /v1/chat/completions,
// whole or streamed as server-sent events, each choice of each prompt a request of the
// router's (http_gateway_impl.hpp).
#include <numeric>

#include "actors/caf/type_ids.hpp"
#include "actors/gateway/http_gateway_impl.hpp"
#include "actors/wire/client_codec.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;


// The HTTP answer to a request that ended in an error: the request's own fault is a 400, no
// replica able to serve it in time a 503 (retry later), the server's fault a 500, and the
// gateway's own deadline passing a 504.
openai::api_error failure_of(const std::string& why, error_code kind, bool timed_out) {
  if (timed_out) return {504, why, "timeout_error", "", "timeout"};
  if (kind == error_code::invalid) return {400, why, "invalid_request_error", "", ""};
  if (kind == error_code::unavailable) return {503, why, "server_error", "", "unavailable"};
  return {500, why, "server_error", "", ""};
}

// One completion request (every choice of every prompt), driven by its sink actor's
// messages: the router's chunks and ends, the gateway's deadline, and the client leaving.
// Whole answers are sent once every choice has ended; streams as events, each written as
// it comes. Touched only from the sink actor.
struct completion_job {
  http_gateway::impl& g;
  std::shared_ptr<http::exchange> ex;
  http::response head;  // the answer's headers so far (CORS)
  std::shared_ptr<admission::ticket> held;
  std::vector<uint64_t> ids;
  bool chat = false, stream = false, include_usage = false;
  bool logprobs = false;
  int32_t n = 1;
  std::string cid, model;
  int64_t created = 0;
  openai::token_text text_of;
  caf::event_based_actor* self = nullptr;

  std::vector<openai::choice_result> choices;
  std::vector<bool> finished, started;
  // Per prompt (its choices share it): its tokens, and those the prefix cache served.
  std::vector<uint32_t> prompt_tokens_of, cached_tokens_of;
  uint32_t output_tokens = 0;
  size_t done = 0;
  std::string error;
  error_code error_type = error_code::invalid;
  bool timed_out = false;    // the gateway's own deadline passed
  bool client_gone = false;  // the client went away before the end
  bool streaming = false;    // the stream's head is sent
  bool over = false;
  request_times times;

  completion_job(http_gateway::impl& gw, std::shared_ptr<http::exchange> e) : g(gw), ex(std::move(e)) {}

  uint32_t prompt_tokens() const { return std::accumulate(prompt_tokens_of.begin(), prompt_tokens_of.end(), 0u); }
  uint32_t cached_tokens() const { return std::accumulate(cached_tokens_of.begin(), cached_tokens_of.end(), 0u); }
  int index_of(uint64_t id) const {
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == id) return static_cast<int>(i);
    return -1;
  }

  void on_chunk(const wire_message& m) {
    if (over || !m.bytes) return;
    auto c = wire::decode_token_chunk(*m.bytes);
    if (!c) return;
    const int i = index_of(c->request);
    if (i < 0) return;
    g.m->chunk(times);
    choices[i].text += c->text;
    choices[i].tokens.insert(choices[i].tokens.end(), c->tokens.begin(), c->tokens.end());
    choices[i].logprobs.insert(choices[i].logprobs.end(), c->logprobs.begin(), c->logprobs.end());
    if (!stream || (c->text.empty() && c->logprobs.empty())) return;
    if (!begin()) return;
    const bool first = !started[i];
    started[i] = true;
    send(openai::chunk_body(cid, chat, model, created, i, c->text, std::nullopt, first, &c->logprobs, text_of));
  }

  void on_done(const wire_message& m) {
    if (over || !m.bytes) return;
    auto v = wire::decode_generate_result(*m.bytes);
    if (!v) return;
    const int i = index_of(v->request);
    if (i < 0 || finished[i]) return;
    finished[i] = true;
    ++done;
    choices[i].reason = v->reason;
    prompt_tokens_of[i / n] = v->prompt_tokens;
    output_tokens += v->output_tokens;
    cached_tokens_of[i / n] = std::max(cached_tokens_of[i / n], v->cached_prompt_tokens);
    if (!v->error.empty() && error.empty()) {
      error = v->error;
      error_type = v->error_type;
    }
    if (stream && v->error.empty() && begin())
      send(openai::chunk_body(cid, chat, model, created, i, "", v->reason, !started[i]));
    if (done == ids.size()) end();
  }

  // The gateway's deadline passed: what still runs is cancelled, and the answer says so.
  void on_deadline() {
    if (over) return;
    cancel_all();
    error = "the request took longer than " + std::to_string(g.cfg.request_timeout_s) + " s";
    timed_out = true;
    end();
  }

  // The client has gone (its connection closed or reset, or it read too slowly).
  void on_gone() {
    if (over) return;
    client_gone = true;
    cancel_all();
    finish();
  }

 private:
  // The stream's head, once; false if the client is gone.
  bool begin() {
    if (!streaming) {
      streaming = true;
      http::response h = head;
      h.set("Content-Type", "text/event-stream");
      h.set("Cache-Control", "no-cache");
      ex->begin_stream(std::move(h));
    }
    return !over;
  }
  // One server-sent event; a client that cannot take it is gone.
  void send(const std::string& payload) {
    if (over) return;
    if (!ex->write("data: " + payload + "\n\n")) on_gone();
  }
  void cancel_all() {
    for (size_t i = 0; i < ids.size(); ++i)
      if (!finished[i]) caf::anon_send(g.router, cancel_atom_v, ids[i]);
  }

  // Every choice has ended, or the deadline has passed: the answer, then the end.
  void end() {
    if (stream && (streaming || !error_first())) {
      begin();
      if (!error.empty()) send(openai::error_body(failure_of(error, error_type, timed_out)));
      if (include_usage) send(openai::usage_chunk_body(cid, chat, model, created, prompt_tokens(), output_tokens, cached_tokens()));
      send("[DONE]");
      if (!over) ex->end_stream();
      return finish();
    }
    http::response r = head;
    if (!error.empty()) {
      const openai::api_error e = failure_of(error, error_type, timed_out);
      if (e.status == 503) r.set("Retry-After", "1");
      http_gateway::impl::send_error(r, e);
    } else {
      http_gateway::impl::set_json(r, openai::completion_body(cid, chat, model, created, choices, prompt_tokens(), output_tokens,
                                                              cached_tokens(), logprobs, text_of));
    }
    ex->respond(std::move(r));
    finish();
  }
  // Whether a stream that has sent nothing ends in an error answered with its own status:
  // one completion refused before any token (SLO admission, no replica in time, a request
  // the scheduler will not take) is answered with that status and the reason, not a 200
  // stream carrying the error.
  bool error_first() const { return ids.size() == 1 && !error.empty() && output_tokens == 0 && !timed_out; }

  void finish() {
    if (over) return;
    over = true;
    g.m->finished(client_gone ? "cancelled" : request_outcome(choices[0].reason, error, error_type, timed_out), prompt_tokens(),
                  output_tokens, times);
    held->release();
    if (self) self->quit();
  }
};

caf::behavior completion_sink(caf::event_based_actor* self, std::shared_ptr<completion_job> job,
                              std::chrono::milliseconds deadline) {
  job->self = self;
  self->delayed_send(self, deadline, tick_atom_v);
  return {
      [job](chunk_atom, const wire_message& m) { job->on_chunk(m); },
      [job](done_atom, const wire_message& m) { job->on_done(m); },
      [job](tick_atom) { job->on_deadline(); },
      [job](cancel_atom) { job->on_gone(); },
  };
}

}  // namespace

bool http_gateway::impl::completions(const std::shared_ptr<http::exchange>& ex, http::response& res, bool chat) {
  const auto t0 = clock_type::now();
  const http::request& req = ex->req();
  if (!authorized(req, res)) return true;
  if (draining) {
    send_error(res, {503, "the server is shutting down", "server_error", "", ""});
    return true;
  }
  auto parsed = openai::parse_request(req.body, chat, cfg.model_id, cfg.chat, cfg.limits);
  if (auto* e = std::get_if<openai::api_error>(&parsed)) {
    m->refused("invalid");
    send_error(res, *e);
    return true;
  }
  auto r = std::get<openai::api_request>(std::move(parsed));
  if (chat && turn_end) r.params.stop_tokens.push_back(*turn_end);
  if (!cfg.api_keys.empty()) r.params.cache_namespace = cache_namespace_of(key_of(req), cfg.prefix_cache_per_key);
  // The SLO class by header, where the body names none.
  if (const std::string h = req.header("X-Troupe-Class"); !h.empty() && r.params.slo_class.empty()) {
    if (h.size() > wire::max_class_name) {
      m->refused("invalid");
      send_error(res, {400, "the X-Troupe-Class header must be a class's name (1 to 64 bytes)", "invalid_request_error",
                       "slo_class", ""});
      return true;
    }
    r.params.slo_class = h;
  }
  // Admission (admission.hpp): a full server answers at once; every choice of every
  // prompt is a completion.
  auto place = admit.admit(static_cast<int32_t>(r.prompts.size()) * r.n);
  if (!place) {
    m->refused("rejected");
    res.set("Retry-After", "1");
    send_error(res, {429, "the server is at capacity; retry shortly", "rate_limit_error", "", "overloaded"});
    return true;
  }
  auto job = std::make_shared<completion_job>(*this, ex);
  job->head = res;
  job->held = std::make_shared<admission::ticket>(std::move(*place));
  job->chat = chat;
  job->stream = r.stream;
  job->include_usage = r.include_usage;
  job->logprobs = r.logprobs;
  job->n = r.n;
  job->model = r.model;
  job->times.start = t0;
  job->created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  job->text_of = [tok = cfg.tok](int32_t t) { return tok ? std::string(tok->decode(-1, t)) : std::to_string(t); };
  const size_t total = r.prompts.size() * static_cast<size_t>(r.n);
  for (size_t i = 0; i < total; ++i) job->ids.push_back(next_id++);
  job->cid = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(job->ids[0]);
  job->choices.resize(total);
  job->finished.assign(total, false);
  job->started.assign(total, false);
  job->prompt_tokens_of.assign(r.prompts.size(), 0);
  job->cached_tokens_of.assign(r.prompts.size(), 0);
  auto sink = sys.spawn(completion_sink, job, std::chrono::milliseconds(std::chrono::seconds(cfg.request_timeout_s)));
  size_t k = 0;
  for (const auto& prompt : r.prompts)
    for (int32_t i = 0; i < r.n; ++i) {
      request_params p = r.params;
      p.sampling.seed += static_cast<uint64_t>(i);  // n different samples; a prompt's are the same in any company
      if (prompt.is_tokens) p.prompt = prompt.tokens;
      auto frame = prompt.is_tokens ? wire::encode_generate_request_tokens(p)
                                    : wire::encode_generate_request_text(prompt.text, p);
      caf::anon_send(router, generate_atom_v, job->ids[k++], wire_message(wire_kind::none, std::move(frame)), sink);
    }
  // (After the requests: a client already gone has them cancelled, not left to run.)
  ex->on_gone([sink] { caf::anon_send(sink, cancel_atom_v); });
  return false;
}

}  // namespace troupe
