// The Gateway's calls, on the KJ thread (rpc_gateway_impl.hpp).
#include <capnp/serialize.h>

#include "actors/caf/type_ids.hpp"
#include "actors/gateway/api_keys.hpp"
#include "actors/gateway/router_calls.hpp"
#include "actors/gateway/rpc_gateway_impl.hpp"
#include "actors/wire/client_codec.hpp"
#include "actors/wire/frame.hpp"

namespace troupe {

kj::Promise<void> gateway_server::generate(GenerateContext context) {
  if (g_.draining) return KJ_EXCEPTION(OVERLOADED, "the gateway is draining: it takes no new requests");
  auto params = context.getParams();
  if (!key_allowed(g_.api_keys, params.getApiKey().cStr())) return KJ_EXCEPTION(FAILED, "missing or wrong API key");
  // Admission (admission.hpp): past the requests in flight it takes, the gateway refuses
  // at once (the client may retry) rather than queue without bound.
  auto place = admit_.admit(1);
  if (!place) {
    g_.metrics->refused("rejected");
    return kj::Exception(kj::Exception::Type::OVERLOADED, __FILE__, __LINE__,
                         kj::str("the gateway is at capacity: ", admit_.budget(), " requests in flight; retry shortly"));
  }
  const uint64_t id = next_id_++;
  capnp::MallocMessageBuilder copy;
  copy.setRoot(params.getRequest());
  {
    auto r = copy.getRoot<schema::GenerateRequest>();
    // A client's delivered tokens are what another gateway gave it before that gateway was
    // lost: the request goes on after them. Handing requests over is the router's alone.
    r.disownKvTo();
    r.setKvFrom(0);
  }
  copy.getRoot<schema::GenerateRequest>().setCacheNamespace(  // never the client's choice
      g_.api_keys.empty() ? 0 : cache_namespace_of(params.getApiKey().cStr(), per_key_));
  sinks_.emplace(id, request_sink{params.getSink(), params.getApiKey().cStr(), std::move(*place), {}});
  caf::anon_send(g_.router, generate_atom_v, id, wire_message(wire_kind::none, wire::to_bytes(copy)), g_.sink_actor);
  context.getResults().setRequestId(id);
  return kj::READY_NOW;
}

kj::Promise<void> gateway_server::cancel(CancelContext context) {
  if (!key_allowed(g_.api_keys, context.getParams().getApiKey().cStr())) return KJ_EXCEPTION(FAILED, "missing or wrong API key");
  // Only the key that made a request may cancel it (another client's request reads as
  // unknown).
  const uint64_t id = context.getParams().getRequestId();
  const auto it = sinks_.find(id);
  const bool known = it != sinks_.end() && same_key(it->second.api_key, context.getParams().getApiKey().cStr());
  if (known) caf::anon_send(g_.router, cancel_atom_v, id);
  context.getResults().setFound(known);
  return kj::READY_NOW;
}

kj::Promise<void> gateway_server::health(HealthContext context) {
  const router_health r = ask_health(g_.sys, g_.router, g_.draining);
  auto h = context.getResults().initHealth();
  h.setReady(r.ready);
  h.setReplicas(r.replicas);
  h.setReplicasReady(r.replicas_ready);
  h.setOutages(r.outages);
  h.setLastDownMs(r.last_down_ms);
  h.setDetail(r.detail);
  return kj::READY_NOW;
}

kj::Promise<void> gateway_server::stats(StatsContext context) {
  if (!key_allowed(g_.api_keys, context.getParams().getApiKey().cStr())) return KJ_EXCEPTION(FAILED, "missing or wrong API key");
  const router_stats r = ask_stats(g_.sys, g_.router);
  auto s = context.getResults().initStats();
  s.setKvBlocksUsed(r.kv_used);
  s.setKvBlocksFree(r.kv_free);
  s.setRequestsRunning(r.running);
  s.setRequestsWaiting(r.waiting);
  return kj::READY_NOW;
}

kj::Promise<void> gateway_server::pump() {
  return g_.events->wait().then([this]() {
    for (event& e : g_.events->drain()) forward(e);
    return pump();
  });
}

void gateway_server::forward(const event& e) {
  if (!e.frame.bytes) return;
  wire::frame_limits lim;
  lim.max_bytes = size_t{1} << 24;
  lim.traversal_words = size_t{1} << 22;
  auto f = wire::frame_reader::parse(*e.frame.bytes, lim);
  if (!f) return;
  if (!e.done) {
    auto chunk = (*f)->root<schema::TokenChunk>();
    auto it = sinks_.find(chunk.getRequestId());
    if (it == sinks_.end()) return;
    request_sink& r = it->second;
    g_.metrics->chunk(r.times);
    r.output_tokens += chunk.getTokens().size();
    const uint64_t id = chunk.getRequestId();
    const size_t n = e.frame.bytes->size();
    if (r.unacknowledged + n > max_unacknowledged) {
      // The client takes its chunks too slowly: the request ends rather than queue them.
      g_.metrics->slow_reader(gateway_metrics::api::capnp);
      return client_gone(id);
    }
    r.unacknowledged += n;
    auto req = r.sink.chunkRequest();
    req.setChunk(chunk);
    // A chunk that cannot be delivered (the client has gone) ends its request: the
    // replica stops generating for no one.
    tasks_.add(req.send().then(
        [this, id, n]() {
          if (auto it = sinks_.find(id); it != sinks_.end()) it->second.unacknowledged -= n;
        },
        [this, id](kj::Exception&&) { client_gone(id); }));
  } else {
    auto result = (*f)->root<schema::GenerateResult>();
    auto it = sinks_.find(result.getRequestId());
    if (it == sinks_.end()) return;
    if (auto v = wire::read_generate_result(result))
      g_.metrics->finished(request_outcome(v->reason, v->error, v->error_type, false), v->prompt_tokens,
                           v->output_tokens, it->second.times);
    auto req = it->second.sink.doneRequest();
    req.setResult(result);
    tasks_.add(req.send().ignoreResult());
    sinks_.erase(it);
  }
}

void gateway_server::client_gone(uint64_t id) {
  auto it = sinks_.find(id);
  if (it == sinks_.end()) return;
  g_.metrics->finished("cancelled", 0, it->second.output_tokens, it->second.times);
  sinks_.erase(it);
  caf::anon_send(g_.router, cancel_atom_v, id);
}

capnp::ReaderOptions rpc_reader_options() {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = 1 << 20;  // a request of up to 8 MiB
  o.nestingLimit = 16;
  return o;
}


}  // namespace troupe
