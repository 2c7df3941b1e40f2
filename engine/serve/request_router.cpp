#include "engine/serve/request_router.hpp"

#include "kernels/common/assert.hpp"

namespace troupe {

namespace {

double ms_between(router_clock::time_point a, router_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

request_router::request_router(size_t num_replicas, std::chrono::milliseconds wait_timeout)
    : wait_timeout_(wait_timeout), replicas_(num_replicas) {
  for (auto& r : replicas_) r.detail = "not found yet";
}

route_actions request_router::accept(uint64_t id, router_clock::time_point now) {
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
  send_or_park(id, r, out);
  return out;
}

void request_router::send_or_park(uint64_t id, routed& r, route_actions& out) {
  int32_t best = -1;
  for (size_t k = 0; k < replicas_.size(); ++k) {
    const replica_view& rep = replicas_[k];
    if (rep.found && rep.ready && (best < 0 || rep.active < replicas_[best].active)) best = static_cast<int32_t>(k);
  }
  if (best < 0) {
    r.attempt = 0;
    r.replica = -1;
    parked_.push_back(id);
    return;
  }
  // A first attempt carries the client's id, so its chunks pass through unchanged.
  const bool first = r.resubmits == 0 && !attempts_.count(id);
  r.attempt = first ? id : next_attempt_++;
  r.replica = best;
  attempts_[r.attempt] = id;
  ++replicas_[best].active;
  out.sends.push_back(route_send{id, r.attempt, static_cast<size_t>(best), !r.delivered.empty()});
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
    if (now - it->second.parked_since > wait_timeout_) {
      const auto ms = wait_timeout_.count();
      out.ends.push_back(end(id, route_outcome::failed, error_code::unavailable,
                             "no replica could serve the request within " +
                                 (ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms"),
                             now));
      continue;
    }
    send_or_park(id, it->second, out);
  }
}

route_actions request_router::tick(router_clock::time_point now) {
  route_actions out;
  unpark(now, out);
  return out;
}

void request_router::set_ready(replica_view& rep, bool ready) {
  if (rep.ready && !ready) ++outages_;
  rep.ready = ready;
}

void request_router::replica_found(size_t k) { replicas_[k].found = true; }

route_actions request_router::replica_health(size_t k, bool ready, std::string detail, router_clock::time_point now) {
  route_actions out;
  replica_view& rep = replicas_[k];
  if (!rep.found) return out;  // news from a scheduler given up on
  const bool was = rep.ready;
  set_ready(rep, ready);
  rep.detail = std::move(detail);
  if (ready && !was) unpark(now, out);
  return out;
}

route_actions request_router::replica_lost(size_t k, std::string why, router_clock::time_point now) {
  route_actions out;
  replica_view& rep = replicas_[k];
  rep.found = false;
  set_ready(rep, false);
  rep.detail = std::move(why);
  rep.active = 0;
  ++failovers_;
  std::vector<uint64_t> moved, cancelled;
  for (auto& [id, r] : requests_) {
    if (r.replica != static_cast<int32_t>(k) || r.attempt == 0) continue;
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
  for (uint64_t id : moved) send_or_park(id, requests_.at(id), out);
  return out;
}

uint32_t request_router::num_ready() const {
  uint32_t n = 0;
  for (const auto& r : replicas_) n += r.found && r.ready;
  return n;
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
