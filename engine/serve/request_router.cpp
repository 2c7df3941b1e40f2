#include "engine/serve/request_router.hpp"

#include <algorithm>

#include "kernels/common/assert.hpp"

namespace troupe {

namespace {

double ms_between(router_clock::time_point a, router_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

std::string_view replica_role_name(replica_role r) {
  switch (r) {
    case replica_role::both: return "both";
    case replica_role::prefill: return "prefill";
    case replica_role::decode: return "decode";
  }
  return "both";
}

request_router::request_router(size_t num_replicas, const route_config& cfg)
    : cfg_(cfg), replicas_(num_replicas), recent_(num_replicas), next_attempt_(request_id_base(2, cfg.gateway)) {
  for (auto& r : replicas_) r.detail = "not found yet";
}

route_actions request_router::accept(uint64_t id, router_clock::time_point now, route_prompt prompt) {
  route_actions out;
  if (requests_.count(id)) {
    // Not this request's end: the one in use keeps its own. Said to this caller alone.
    route_end e;
    e.request = id;
    e.outcome = route_outcome::failed;
    e.code = error_code::invalid;
    e.why = "request id in use";
    out.ends.push_back(std::move(e));
    return out;
  }
  routed& r = requests_[id];
  r.arrived = r.parked_since = now;
  r.delivered = std::move(prompt.delivered);  // a resubmission from the start
  r.prompt = std::move(prompt);
  send_or_park(id, r, out, now);
  return out;
}

size_t request_router::expected_blocks(size_t k, const route_prompt& p, router_clock::time_point now) {
  const replica_view& rep = replicas_[k];
  const recent_blocks& recent = recent_[k];
  size_t n = 0;
  for (; n < p.chain.size(); ++n) {
    const uint64_t h = p.chain[n];
    if (rep.summary && rep.summary->contains(h)) continue;
    auto it = recent.at.find(h);
    if (it == recent.at.end() || now - it->second > cfg_.recent_ttl) break;
  }
  return n;
}

void request_router::remember(size_t k, const route_prompt& p, router_clock::time_point now) {
  recent_blocks& recent = recent_[k];
  // Forget what is past its time, and the oldest past the bound.
  while (!recent.order.empty() &&
         (now - recent.order.front().second > cfg_.recent_ttl || recent.order.size() >= max_recent_blocks)) {
    auto [h, at] = recent.order.front();
    recent.order.pop_front();
    if (auto it = recent.at.find(h); it != recent.at.end() && it->second == at) recent.at.erase(it);
  }
  for (uint64_t h : p.chain) {
    recent.at[h] = now;
    recent.order.emplace_back(h, now);
  }
}

bool request_router::disaggregated() const {
  return std::any_of(replicas_.begin(), replicas_.end(), [](const replica_view& r) { return r.role == replica_role::prefill; });
}

int32_t request_router::least_loaded_decoder() const {
  int32_t best = -1;
  size_t best_load = 0;
  for (size_t k = 0; k < replicas_.size(); ++k) {
    const replica_view& rep = replicas_[k];
    if (!rep.found || !rep.ready || rep.role == replica_role::prefill) continue;
    const size_t load = rep.active + rep.incoming;
    if (best < 0 || load < best_load) best = static_cast<int32_t>(k), best_load = load;
  }
  return best;
}

int32_t request_router::choose(const routed& r, router_clock::time_point now, size_t& hit_blocks) {
  hit_blocks = 0;
  if (!disaggregated()) return choose_among(r, false, now, hit_blocks);
  auto refused = [&](size_t k) { return k < r.refused_by.size() && r.refused_by[k]; };
  if (r.delivered.empty()) {
    // A prefill replica, while a decode replica is there to take the request on; else, with
    // no prefill replica ready, a decode replica computes it whole. Every ready one refused
    // it (SLO admission): their word stands, for a decode replica computing the prompt
    // would stall its streams for it.
    if (least_loaded_decoder() >= 0) {
      if (const int32_t k = choose_among(r, true, now, hit_blocks); k >= 0) return k;
      if (std::any_of(replicas_.begin(), replicas_.end(), [](const replica_view& v) {
            return v.role == replica_role::prefill && v.found && v.ready;
          }))
        return -1;
    }
  } else if (r.decode_to >= 0) {
    // Handed over: where its KV went.
    const replica_view& rep = replicas_[r.decode_to];
    if (rep.found && rep.ready && !refused(static_cast<size_t>(r.decode_to))) return r.decode_to;
  }
  return choose_among(r, false, now, hit_blocks);
}

int32_t request_router::choose_among(const routed& r, bool prefill, router_clock::time_point now, size_t& hit_blocks) {
  hit_blocks = 0;
  int32_t best = -1;
  auto eligible = [&](size_t k) {
    const replica_view& rep = replicas_[k];
    return rep.found && rep.ready && !(k < r.refused_by.size() && r.refused_by[k]) &&
           (rep.role == replica_role::prefill) == prefill;
  };
  if (cfg_.policy == route_policy::least_loaded) {
    for (size_t k = 0; k < replicas_.size(); ++k)
      if (eligible(k) && (best < 0 || replicas_[k].active < replicas_[best].active)) best = static_cast<int32_t>(k);
    return best;
  }
  double best_cost = 0;
  for (size_t k = 0; k < replicas_.size(); ++k) {
    const replica_view& rep = replicas_[k];
    if (!eligible(k)) continue;
    const size_t hits = expected_blocks(k, r.prompt, now);
    const int64_t miss = std::max<int64_t>(0, r.prompt.tokens - static_cast<int64_t>(hits) * r.prompt.block_size);
    // Blocks it would need past the pool's free ones (the prompt's misses and a block to
    // generate into), in tokens.
    int64_t short_tokens = 0;
    if (rep.free_blocks >= 0 && r.prompt.block_size > 0) {
      const int64_t need = (miss + r.prompt.block_size) / r.prompt.block_size;
      short_tokens = std::max<int64_t>(0, need - rep.free_blocks) * r.prompt.block_size;
    }
    const double cost = static_cast<double>(miss + rep.pending_tokens + short_tokens) +
                        cfg_.stream_tokens * static_cast<double>(rep.active);
    if (best < 0 || cost < best_cost || (cost == best_cost && rep.active < replicas_[best].active)) {
      best = static_cast<int32_t>(k);
      best_cost = cost;
      hit_blocks = hits;
    }
  }
  return best;
}

void request_router::settle_pending(routed& r) {
  if (r.pending == 0) return;
  if (r.replica >= 0) replicas_[r.replica].pending_tokens -= r.pending;
  r.pending = 0;
}

void request_router::drop_decode_target(routed& r) {
  if (r.prefilling && r.decode_to >= 0 && replicas_[r.decode_to].incoming > 0) --replicas_[r.decode_to].incoming;
  r.prefilling = false;
}

void request_router::send_or_park(uint64_t id, routed& r, route_actions& out, router_clock::time_point now) {
  drop_decode_target(r);
  size_t hit_blocks = 0;
  const int32_t best = choose(r, now, hit_blocks);
  if (best < 0) {
    r.attempt = 0;
    r.replica = -1;
    parked_.push_back(id);
    return;
  }
  // A first attempt carries the client's id, so its chunks pass through unchanged.
  const bool first = r.resubmits == 0 && r.delivered.empty() && !attempts_.count(id);
  r.attempt = first ? id : next_attempt_++;
  r.replica = best;
  attempts_[r.attempt] = id;
  ++replicas_[best].active;
  const int64_t hit_tokens = static_cast<int64_t>(hit_blocks) * r.prompt.block_size;
  r.pending = std::max<int64_t>(0, r.prompt.tokens - hit_tokens);
  replicas_[best].pending_tokens += r.pending;
  if (cfg_.policy == route_policy::kv_aware) {
    if (hit_tokens > 0) {
      ++prefix_routed_;
      expected_hit_tokens_ += static_cast<uint64_t>(hit_tokens);
    }
    remember(static_cast<size_t>(best), r.prompt, now);
  }
  route_send s{id, r.attempt, static_cast<size_t>(best), !r.delivered.empty()};
  if (replicas_[best].role == replica_role::prefill) {
    r.decode_to = least_loaded_decoder();  // (choose checked there is one)
    r.kv_sent = 0;
    r.prefilling = true;
    ++replicas_[r.decode_to].incoming;
    s.kv_to = r.decode_to;
  } else if (best == r.decode_to) {
    s.kv_from = r.kv_sent;
  }
  out.sends.push_back(s);
}

route_end request_router::end(uint64_t id, route_outcome outcome, error_code code, std::string why,
                              router_clock::time_point now) {
  auto it = requests_.find(id);
  TROUPE_ASSERT(it != requests_.end(), id);
  routed& r = it->second;
  route_end e;
  e.request = id;
  e.outcome = outcome;
  e.code = code;
  e.why = std::move(why);
  e.seq = r.seq;
  e.delivered_tokens = static_cast<uint32_t>(r.delivered.size());
  e.replica = r.replica;
  e.resubmits = r.resubmits;
  e.ttft_ms = r.ttft_ms;
  e.e2e_ms = ms_between(r.arrived, now);
  settle_pending(r);
  drop_decode_target(r);
  if (r.attempt != 0) {
    attempts_.erase(r.attempt);
    if (r.replica >= 0 && replicas_[r.replica].active > 0) --replicas_[r.replica].active;
  }
  requests_.erase(it);
  return e;
}

bool request_router::cancel(uint64_t id, router_clock::time_point now, route_actions& out) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  routed& r = it->second;
  if (r.attempt == 0) {
    out.ends.push_back(end(id, route_outcome::cancelled, error_code::invalid, "", now));
    return true;
  }
  r.cancelled = true;
  out.cancels.push_back(route_cancel{static_cast<size_t>(r.replica), r.attempt});
  return true;
}

std::optional<route_chunk> request_router::chunk(uint64_t attempt, std::span<const int32_t> tokens,
                                                 router_clock::time_point now) {
  auto a = attempts_.find(attempt);
  if (a == attempts_.end()) return std::nullopt;
  routed& r = requests_.at(a->second);
  if (r.ttft_ms < 0 && !tokens.empty()) r.ttft_ms = ms_between(r.arrived, now);
  if (!tokens.empty()) settle_pending(r);
  r.delivered.insert(r.delivered.end(), tokens.begin(), tokens.end());
  return route_chunk{a->second, r.seq++};
}

std::optional<route_end> request_router::done(uint64_t attempt, std::span<const int32_t> last_tokens,
                                              router_clock::time_point now) {
  auto a = attempts_.find(attempt);
  if (a == attempts_.end()) return std::nullopt;
  routed& r = requests_.at(a->second);
  if (r.ttft_ms < 0 && !last_tokens.empty()) r.ttft_ms = ms_between(r.arrived, now);
  r.delivered.insert(r.delivered.end(), last_tokens.begin(), last_tokens.end());
  return end(a->second, route_outcome::finished, error_code::internal, "", now);
}

route_actions request_router::refused(uint64_t attempt, std::string why, router_clock::time_point now) {
  route_actions out;
  auto a = attempts_.find(attempt);
  if (a == attempts_.end()) return out;
  const uint64_t id = a->second;
  routed& r = requests_.at(id);
  const auto k = static_cast<size_t>(r.replica);
  r.refused_by.resize(replicas_.size());
  r.refused_by[k] = true;
  // Another replica that is ready and has not refused it: sent there as a new attempt.
  size_t hits = 0;
  if (choose(r, now, hits) < 0) {
    out.ends.push_back(end(id, route_outcome::failed, error_code::unavailable, std::move(why), now));
    return out;
  }
  settle_pending(r);
  attempts_.erase(r.attempt);
  if (replicas_[k].active > 0) --replicas_[k].active;
  r.attempt = 0;
  r.replica = -1;
  ++r.resubmits;
  ++redirected_;
  send_or_park(id, r, out, now);
  return out;
}

route_actions request_router::handed_off(uint64_t attempt, uint32_t kv_sent, router_clock::time_point now) {
  route_actions out;
  auto a = attempts_.find(attempt);
  if (a == attempts_.end()) return out;
  const uint64_t id = a->second;
  routed& r = requests_.at(id);
  if (r.cancelled) {
    out.ends.push_back(end(id, route_outcome::cancelled, error_code::invalid, "", now));
    return out;
  }
  if (r.delivered.empty() || !r.prefilling) {
    out.ends.push_back(end(id, route_outcome::failed, error_code::internal,
                           "a replica handed over a request it was not asked to prefill", now));
    return out;
  }
  settle_pending(r);
  attempts_.erase(r.attempt);
  if (r.replica >= 0 && replicas_[r.replica].active > 0) --replicas_[r.replica].active;
  drop_decode_target(r);
  r.kv_sent = kv_sent;
  r.attempt = 0;
  r.replica = -1;
  r.parked_since = now;
  ++handoffs_;
  send_or_park(id, r, out, now);
  return out;
}

std::optional<route_end> request_router::fail(uint64_t id, error_code code, std::string why,
                                              router_clock::time_point now) {
  if (!requests_.count(id)) return std::nullopt;
  return end(id, route_outcome::failed, code, std::move(why), now);
}

const std::vector<int32_t>& request_router::delivered(uint64_t id) const { return requests_.at(id).delivered; }

void request_router::unpark(router_clock::time_point now, route_actions& out) {
  std::deque<uint64_t> parked;
  parked.swap(parked_);
  for (uint64_t id : parked) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.attempt != 0) continue;
    if (now - it->second.parked_since > cfg_.wait_timeout) {
      const auto ms = cfg_.wait_timeout.count();
      out.ends.push_back(end(id, route_outcome::failed, error_code::unavailable,
                             "no replica could serve the request within " +
                                 (ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms"),
                             now));
      continue;
    }
    send_or_park(id, it->second, out, now);
  }
}

route_actions request_router::tick(router_clock::time_point now) {
  route_actions out;
  unpark(now, out);
  return out;
}

void request_router::set_ready(replica_view& rep, bool ready, router_clock::time_point now) {
  if (rep.ready && !ready) last_down_ = now;
  if (rep.ready && !ready && !(rep.down_before && now - rep.ready_since < outage_settle)) {
    ++outages_;
    rep.down_before = true;
  }
  if (!rep.ready && ready) rep.ready_since = now;
  rep.ready = ready;
}

void request_router::replica_found(size_t k) { replicas_[k].found = true; }

route_actions request_router::replica_health(size_t k, bool ready, std::string detail, router_clock::time_point now) {
  route_actions out;
  replica_view& rep = replicas_[k];
  if (!rep.found) return out;  // news from a scheduler given up on
  const bool was = rep.ready;
  set_ready(rep, ready, now);
  rep.detail = std::move(detail);
  if (ready && !was) unpark(now, out);
  return out;
}

route_actions request_router::replica_lost(size_t k, std::string why, router_clock::time_point now) {
  route_actions out;
  replica_view& rep = replicas_[k];
  rep.found = false;
  set_ready(rep, false, now);
  rep.detail = std::move(why);
  rep.active = 0;
  rep.pending_tokens = 0;
  rep.free_blocks = -1;
  rep.summary.reset();  // its cache may be gone with it
  recent_[k] = {};
  // KV handed (or on its way) to it is gone: the requests go to another decode replica,
  // which computes their prompts.
  rep.incoming = 0;
  for (auto& [id, r] : requests_)
    if (r.decode_to == static_cast<int32_t>(k)) {
      r.decode_to = -1;  // (one still prefilling elsewhere is handed to another)
      r.kv_sent = 0;
    }
  ++failovers_;
  std::vector<uint64_t> moved, cancelled;
  for (auto& [id, r] : requests_) {
    if (r.replica != static_cast<int32_t>(k) || r.attempt == 0) continue;
    r.pending = 0;  // the replica's count went with it
    (r.cancelled ? cancelled : moved).push_back(id);
  }
  // A request its client cancelled ends now, as cancelled, wherever its replica went.
  for (uint64_t id : cancelled) out.ends.push_back(end(id, route_outcome::cancelled, error_code::invalid, "", now));
  for (uint64_t id : moved) {
    routed& r = requests_.at(id);
    attempts_.erase(r.attempt);
    r.attempt = 0;
    r.replica = -1;
    r.parked_since = now;
    ++r.resubmits;
  }
  resubmitted_ += moved.size();
  for (uint64_t id : moved) send_or_park(id, requests_.at(id), out, now);
  return out;
}

uint32_t request_router::num_ready() const {
  uint32_t n = 0;
  for (const auto& r : replicas_) n += r.found && r.ready;
  return n;
}

bool request_router::can_serve() const {
  return std::any_of(replicas_.begin(), replicas_.end(),
                     [](const replica_view& r) { return r.found && r.ready && r.role != replica_role::prefill; });
}

std::string request_router::not_ready_detail(std::span<const std::string> names) const {
  std::string detail;
  for (size_t k = 0; k < replicas_.size(); ++k) {
    const replica_view& r = replicas_[k];
    if (r.found && r.ready) continue;
    if (!detail.empty()) detail += "; ";
    detail += "replica " + (k < names.size() ? names[k] : std::to_string(k)) + ": " +
              (r.detail.empty() ? "not ready" : r.detail);
  }
  return detail;
}

}  // namespace troupe
