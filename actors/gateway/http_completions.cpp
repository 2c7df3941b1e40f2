// The completion routes of the HTTP gateway: /v1/completions and /v1/chat/completions,
// whole or streamed as server-sent events, each choice of each prompt a request of the
// router's (http_gateway_impl.hpp).
#include <condition_variable>
#include <deque>
#include <mutex>
#include <numeric>

#include "actors/caf/type_ids.hpp"
#include "actors/gateway/http_gateway_impl.hpp"
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
  // An event taken and given back, to be the next again.
  void unpop(stream_event e) {
    std::lock_guard<std::mutex> lock(mu);
    q.push_front(std::move(e));
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

}  // namespace

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
  // The SLO class by header, where the body names none.
  if (const std::string h = req.get_header_value("X-Troupe-Class"); !h.empty() && r.params.slo_class.empty()) {
    if (h.size() > wire::max_class_name) {
      m->refused("invalid");
      return send_error(res, {400, "the X-Troupe-Class header must be a class's name (1 to 64 bytes)", "invalid_request_error",
                              "slo_class", ""});
    }
    r.params.slo_class = h;
  }
  // Admission (admission.hpp): a full server answers at once; every choice of every
  // prompt is a completion.
  auto place = admit.admit(static_cast<int32_t>(r.prompts.size()) * r.n);
  if (!place) {
    m->refused("rejected");
    res.set_header("Retry-After", "1");
    return send_error(res, {429, "the server is at capacity; retry shortly", "rate_limit_error", "", "overloaded"});
  }
  auto held = std::make_shared<admission::ticket>(std::move(*place));
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
    held->release();
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

  // A stream of one completion takes its status from its first event: refused before any
  // token (SLO admission, no replica in time, a request the scheduler will not take), it is
  // answered with that status and the reason, not a 200 stream carrying the error. The
  // connection is watched meanwhile, as for a whole answer.
  if (ids.size() == 1) {
    std::optional<stream_event> first;
    auto next_look = clock_type::now();
    while (!first) {
      first = stream->pop(std::min(deadline, next_look + std::chrono::milliseconds(250)));
      const auto now = clock_type::now();
      if (first || now >= deadline) break;  // past the deadline, the stream says so
      if (now >= next_look + std::chrono::milliseconds(250)) {
        next_look = now;
        if (watch && watch->gone(req.remote_addr, req.remote_port)) {
          cancel_all();
          st->client_gone = true;
          caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
          finish_metrics();
          held->release();
          return;
        }
      }
    }
    if (first && first->done) {
      auto v = first->frame.bytes ? wire::decode_generate_result(*first->frame.bytes) : expected<wire::result_view>(error{""});
      if (v && !v->error.empty() && v->output_tokens == 0) {
        apply(*first, nullptr);
        caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
        finish_metrics();
        held->release();
        const openai::api_error e = failure_of(st->error, st->error_type, st->timed_out);
        if (e.status == 503) res.set_header("Retry-After", "1");
        return send_error(res, e);
      }
    }
    if (first) stream->unpop(std::move(*first));
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
      [sink, st, finish_metrics, cancel_all, n = ids.size(), held](bool) {
        st->client_gone = st->done < n && !st->timed_out;  // the stream ended before its requests did
        cancel_all();  // no-op for finished choices
        caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
        finish_metrics();
        held->release();
      });
}

}  // namespace troupe
