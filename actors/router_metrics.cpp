// The router's metrics (Prometheus text for /metrics) and status (JSON for /status.json),
// made from what its polls gathered (router_polls.cpp, router_state.hpp).
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "actors/metrics/prometheus_text.hpp"
#include "actors/router_state.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/wire/control_codec.hpp"

namespace troupe::router_actor_impl {

namespace {

// Every replica's figures: its earlier schedulers' counters with its scheduler's now.
std::vector<scheduler_figures> figures_of(const router_state& st) {
  std::vector<scheduler_figures> all;
  for (const auto& rep : st.replicas) all.push_back(with_counters(rep.base, rep.now));
  return all;
}

// The count at index i, 0 past the end (a scheduler that sent fewer).
double at(const std::vector<uint64_t>& v, size_t i) { return i < v.size() ? static_cast<double>(v[i]) : 0.0; }

// Speculative decoding's figures, summed per method over the replicas that use one.
void render_speculation(prometheus_text& out, const router_state& st) {
  std::map<std::string, speculation_figures> by_method;
  const std::vector<scheduler_figures> figures = figures_of(st);
  for (size_t k = 0; k < figures.size(); ++k) {
    // The method is the scheduler's now, its earlier schedulers' until it has answered (a
    // counter never goes back while a restarted scheduler is found).
    const replica_slot& rep = st.replicas[k];
    const std::string& method = rep.polled ? rep.now.spec_method : rep.base.spec_method;
    if (method == "none") continue;
    by_method[method] += figures[k].spec;
  }
  if (by_method.empty()) return;
  const struct {
    const char* name;
    const char* help;
    uint64_t speculation_figures::*count;
  } counters[] = {
      {"troupe_speculative_verifies_total", "Request steps that verified drafted tokens.", &speculation_figures::verifies},
      {"troupe_speculative_proposed_tokens_total", "Drafted tokens verified by the model.", &speculation_figures::proposed},
      {"troupe_speculative_accepted_tokens_total", "Drafted tokens the model accepted.", &speculation_figures::accepted},
  };
  for (const auto& c : counters) {
    out.family(c.name, c.help, "counter");
    for (const auto& [method, f] : by_method) out.sample(c.name, {{"method", method}}, static_cast<double>(f.*c.count));
  }
  const char* len = "troupe_speculative_acceptance_length";
  out.family(len, "Drafted tokens accepted per verifying request step.", "histogram");
  for (const auto& [method, f] : by_method) {
    troupe::histogram h;  // buckets le 0 .. max_draft_tokens
    h.bounds.clear();
    h.counts.clear();
    for (int32_t n = 0; n <= max_draft_tokens; ++n) {
      h.bounds.push_back(n);
      h.counts.push_back(static_cast<uint64_t>(at(f.by_accepted, static_cast<size_t>(n))));
    }
    h.counts.push_back(0);  // (nothing above the last bound)
    h.sum = static_cast<double>(f.accepted);
    h.n = f.verifies;
    out.histogram_samples(len, h, "method", method);
  }
  // How far down verification goes: per depth (a chain's d-th draft, a token tree's d-th
  // level), the verifies whose drafts reached it and those that kept a draft there. A
  // Medusa head guesses one depth, so its own acceptance is its depth's, under `head` too.
  const struct {
    const char* name;
    const char* help;
    std::vector<uint64_t> speculation_figures::*by_depth;
  } depths[] = {
      {"troupe_speculative_depth_offered_total", "Verifying request steps whose drafts reached this depth.",
       &speculation_figures::offered_at},
      {"troupe_speculative_depth_accepted_total", "Verifying request steps that accepted a draft at this depth.",
       &speculation_figures::kept_at},
  };
  for (const auto& c : depths) {
    out.family(c.name, c.help, "counter");
    for (const auto& [method, f] : by_method)
      for (size_t d = 0; d < static_cast<size_t>(max_draft_tokens) && at(f.offered_at, d) > 0; ++d)
        out.sample(c.name, {{"method", method}, {"depth", std::to_string(d + 1)}}, at(f.*c.by_depth, d));
  }
  const auto medusa = by_method.find("medusa");
  if (medusa == by_method.end()) return;
  const char* head = "troupe_speculative_head_acceptance_ratio";
  out.family(head, "Medusa heads: the share of the verifies that reached head h's depth which accepted its draft.",
             "gauge");
  const speculation_figures& f = medusa->second;
  for (size_t d = 0; d < static_cast<size_t>(max_draft_tokens) && at(f.offered_at, d) > 0; ++d)
    out.sample(head, {{"head", std::to_string(d + 1)}}, at(f.kept_at, d) / at(f.offered_at, d));
}

// KV tiers (engine/kv/kv_tiers.hpp): what the schedulers planned, summed over the
// replicas, and what each node's tiers did, by node and kind (a node's counts start again
// when its process does).
void render_tiers(prometheus_text& out, const router_state& st) {
  tier_plan_figures sum;
  bool any = false;
  for (const scheduler_figures& f : figures_of(st)) {
    sum.loaded_tokens += f.tiers.loaded_tokens;
    sum.failed_loads += f.tiers.failed_loads;
    sum.saved_blocks += f.tiers.saved_blocks;
    sum.directory += f.tiers.directory;
  }
  for (const replica_slot& rep : st.replicas) any = any || rep.polled;
  for (const node_slot& n : st.nodes) any = any || !n.tiers.empty();
  if (!any) return;
  out.counter("troupe_kv_tier_loaded_tokens_total", "Prompt tokens whose KV was loaded from the tiers instead of computed.",
              static_cast<double>(sum.loaded_tokens));
  out.counter("troupe_kv_tier_failed_loads_total",
              "Requests whose tier loads failed (a block gone or corrupt): computed again.", static_cast<double>(sum.failed_loads));
  out.counter("troupe_kv_tier_saved_blocks_total", "KV blocks the schedulers had copied down into the tiers.",
              static_cast<double>(sum.saved_blocks));
  out.gauge("troupe_kv_tier_directory_blocks", "Blocks the schedulers believe the tiers hold.", static_cast<double>(sum.directory));
  const struct {
    const char* name;
    const char* help;
    std::function<double(const tier_stats&)> value;
  } figures[] = {
      {"troupe_kv_tier_hits_total", "Blocks loaded from the tier.", [](const tier_stats& s) { return double(s.hits); }},
      {"troupe_kv_tier_misses_total", "Blocks looked up in the tier and absent.", [](const tier_stats& s) { return double(s.misses); }},
      {"troupe_kv_tier_corrupt_total", "Blocks found in the tier failing their checks (dropped, computed again).",
       [](const tier_stats& s) { return double(s.corrupt); }},
      {"troupe_kv_tier_errors_total", "Tier operations that failed (store unreachable, timed out, full).",
       [](const tier_stats& s) { return double(s.errors); }},
      {"troupe_kv_tier_stored_blocks_total", "Blocks written to the tier.", [](const tier_stats& s) { return double(s.stored); }},
      {"troupe_kv_tier_dropped_writes_total", "Writes dropped because the background queue was full.",
       [](const tier_stats& s) { return double(s.dropped); }},
      {"troupe_kv_tier_written_bytes_total", "Bytes written to the tier.", [](const tier_stats& s) { return double(s.bytes_in); }},
      {"troupe_kv_tier_loaded_bytes_total", "Bytes loaded from the tier.", [](const tier_stats& s) { return double(s.bytes_out); }},
      {"troupe_kv_tier_lookups_total", "Lookups in the tier, hits or not.", [](const tier_stats& s) { return double(s.lookups); }},
      {"troupe_kv_tier_lookup_seconds_total", "Time spent in the tier's lookups (over lookups_total: the mean load latency).",
       [](const tier_stats& s) { return s.load_seconds; }},
  };
  for (const auto& f : figures) {
    out.family(f.name, f.help, "counter");
    for (const node_slot& n : st.nodes)
      if (n.answered)
        for (const wire::tier_figures& t : n.tiers) out.sample(f.name, {{"node", n.addr.name}, {"tier", t.kind}}, f.value(t.stats));
  }
}

// What each node's own listeners (step links, KV landings) saw of the peers that connected
// to them: a rising stalled count is a link that stops in the middle of frames (a hung or
// hostile peer); refused and crowded, strangers.
void render_links(prometheus_text& out, const router_state& st) {
  const struct {
    const char* name;
    const char* help;
    std::function<double(const link_counts&)> value;
  } figures[] = {
      {"troupe_link_stalled_total",
       "Connections to a node's step link or KV landing closed for a frame not whole by its deadline (a stalled link).",
       [](const link_counts& c) { return double(c.stalled); }},
      {"troupe_link_refused_total",
       "Connections to a node's step link or KV landing refused: a failed handshake or a frame that breaks the format.",
       [](const link_counts& c) { return double(c.refused); }},
      {"troupe_link_crowded_total", "Handshakes cut short on a node's step link or KV landing to make room for newcomers.",
       [](const link_counts& c) { return double(c.crowded); }},
  };
  for (const auto& f : figures) {
    out.family(f.name, f.help, "counter");
    for (const node_slot& n : st.nodes)
      if (n.answered)
        for (const wire::link_figures& l : n.links)
          out.sample(f.name, {{"node", n.addr.name}, {"link", std::string(link_kind_name(l.kind))}}, f.value(l.counts));
  }
  out.family("troupe_link_last_stall_seconds", "When a node's link last saw a stall (Unix time; absent: never).", "gauge");
  for (const node_slot& n : st.nodes)
    if (n.answered)
      for (const wire::link_figures& l : n.links)
        if (l.counts.last_stall_ms > 0)
          out.sample("troupe_link_last_stall_seconds", {{"node", n.addr.name}, {"link", std::string(link_kind_name(l.kind))}},
                     static_cast<double>(l.counts.last_stall_ms) / 1000);
}

// Each SLO class's requests by outcome, its attainment and its targets.
void render_slo(prometheus_text& out, const router_state& st) {
  const auto& classes = st.setup.classes;
  if (classes.empty()) return;
  out.family("troupe_slo_requests_total", "Requests of each SLO class by outcome: met (both targets), missed, refused "
             "(SLO admission, or no replica in time), failed (errors and cancels, not counted in attainment).", "counter");
  for (size_t c = 0; c < classes.size(); ++c)
    for (size_t o = 0; o < slo_outcomes; ++o)
      out.sample("troupe_slo_requests_total", {{"class", classes[c].name}, {"outcome", slo_outcome_name(static_cast<slo_outcome>(o))}},
                 static_cast<double>(st.slo_counts[c][o]));
  out.family("troupe_slo_attainment", "Of each class's requests met, missed or refused, the share met (1 before any).", "gauge");
  for (size_t c = 0; c < classes.size(); ++c) {
    const auto& n = st.slo_counts[c];
    const double judged = static_cast<double>(n[0] + n[1] + n[2]);
    out.sample("troupe_slo_attainment", {{"class", classes[c].name}}, judged > 0 ? static_cast<double>(n[0]) / judged : 1.0);
  }
  out.family("troupe_slo_target_seconds", "Each class's targets: time to first token (ttft) and per output token (tpot).", "gauge");
  for (const slo_class& c : classes) {
    if (c.ttft_ms > 0) out.sample("troupe_slo_target_seconds", {{"class", c.name}, {"target", "ttft"}}, c.ttft_ms / 1000);
    if (c.tpot_ms > 0) out.sample("troupe_slo_target_seconds", {{"class", c.name}, {"target", "tpot"}}, c.tpot_ms / 1000);
  }
}

}  // namespace

std::string render_metrics(const router_state& st) {
  prometheus_text out;
  out.gauge("troupe_replicas", "Replicas behind the router.", static_cast<double>(st.replicas.size()));
  out.gauge("troupe_replicas_ready", "Replicas that can serve now.", st.core->num_ready());
  out.counter("troupe_replica_failovers_total", "Replica schedulers lost (their requests moved to a ready replica).",
              static_cast<double>(st.core->failovers()));
  out.counter("troupe_requests_resubmitted_total", "Requests resubmitted to another replica.",
              static_cast<double>(st.core->resubmitted()));
  out.counter("troupe_requests_redirected_total",
              "Requests a replica refused before any token (SLO admission) and the router sent to another.",
              static_cast<double>(st.core->redirected()));
  out.counter("troupe_requests_handed_off_total",
              "Requests a prefill replica computed and handed to a decode replica (disaggregation).",
              static_cast<double>(st.core->handoffs()));
  out.family("troupe_replica_role", "Each replica's role: prefill, decode or both (1).", "gauge");
  for (size_t k = 0; k < st.replicas.size(); ++k)
    out.sample("troupe_replica_role", {{"replica", st.names[k]}, {"role", std::string(replica_role_name(st.core->replica(k).role))}}, 1);
  out.family("troupe_replica_requests", "Requests the router has sent to each replica that have not ended.", "gauge");
  for (size_t k = 0; k < st.replicas.size(); ++k)
    out.sample("troupe_replica_requests", {{"replica", st.names[k]}}, static_cast<double>(st.core->replica(k).active));
  const std::vector<scheduler_figures> figures = figures_of(st);
  uint32_t cached = 0;
  uint64_t hits = 0, queried = 0;
  for (const scheduler_figures& f : figures) {
    cached += f.cached;
    hits += f.hit_tokens;
    queried += f.queried_tokens;
  }
  out.gauge("troupe_kv_blocks_cached", "KV blocks holding a cached prefix, in use or free.", cached);
  out.counter("troupe_prefix_cache_hit_tokens_total", "Prompt tokens served by the prefix cache.", static_cast<double>(hits));
  out.counter("troupe_prefix_cache_queried_tokens_total", "Prompt tokens looked up in the prefix cache.",
              static_cast<double>(queried));
  out.family("troupe_replica_prefix_hit_tokens_total", "Prompt tokens served by each replica's prefix cache.", "counter");
  for (size_t k = 0; k < figures.size(); ++k)
    out.sample("troupe_replica_prefix_hit_tokens_total", {{"replica", st.replicas[k].addr.name}},
               static_cast<double>(figures[k].hit_tokens));
  out.family("troupe_replica_prefix_queried_tokens_total", "Prompt tokens looked up in each replica's prefix cache.", "counter");
  for (size_t k = 0; k < figures.size(); ++k)
    out.sample("troupe_replica_prefix_queried_tokens_total", {{"replica", st.replicas[k].addr.name}},
               static_cast<double>(figures[k].queried_tokens));
  render_slo(out, st);
  out.family("troupe_router_summary_blocks",
             "Blocks each replica's prefix-cache summary held when the router last received it (kv-aware).", "gauge");
  for (size_t k = 0; k < st.replicas.size(); ++k) {
    const auto& summary = st.core->replica(k).summary;
    out.sample("troupe_router_summary_blocks", {{"replica", st.names[k]}}, summary ? static_cast<double>(summary->entries()) : 0);
  }
  const bool kv_aware = st.core->config().policy == route_policy::kv_aware;
  out.family("troupe_router_policy", "The routing policy (the label; the value is 1).", "gauge");
  out.sample("troupe_router_policy", {{"policy", kv_aware ? "kv-aware" : "least-loaded"}}, 1);
  out.counter("troupe_router_prefix_routed_total", "Requests sent to a replica expected to hold part of their prompt (kv-aware).",
              static_cast<double>(st.core->prefix_routed()));
  out.counter("troupe_router_expected_hit_tokens_total", "Prompt tokens the chosen replicas were expected to hold (kv-aware).",
              static_cast<double>(st.core->expected_hit_tokens()));
  render_speculation(out, st);
  // KV eviction (engine/kv/kv_eviction.hpp): summed over the replicas.
  eviction_figures ev;
  for (const scheduler_figures& f : figures) {
    ev.evicted_tokens += f.eviction.evicted_tokens;
    ev.requests += f.eviction.requests;
    ev.budget_tokens += f.eviction.budget_tokens;
    ev.held_tokens += f.eviction.held_tokens;
  }
  out.counter("troupe_kv_evicted_tokens_total", "Tokens KV eviction dropped from requests' caches.", static_cast<double>(ev.evicted_tokens));
  out.gauge("troupe_kv_eviction_requests", "Running requests whose KV cache is held within a budget.", static_cast<double>(ev.requests));
  out.gauge("troupe_kv_eviction_budget_tokens", "The KV budgets of those requests, summed.", static_cast<double>(ev.budget_tokens));
  out.gauge("troupe_kv_eviction_held_tokens",
            "Tokens those requests' KV caches hold, summed (against troupe_kv_eviction_budget_tokens: the budget use).",
            static_cast<double>(ev.held_tokens));
  render_tiers(out, st);
  render_links(out, st);
  out.family("troupe_actor_restarts_total",
             "Restarts of a node's supervised actors (the most of any unit), since the node process started.", "counter");
  for (auto& n : st.nodes)
    if (n.answered) out.sample("troupe_actor_restarts_total", {{"node", n.addr.name}}, n.restarts);
  return out.str();
}

std::string recent_link_stalls(const router_state& st) {
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string out;
  for (const node_slot& n : st.nodes)
    for (const wire::link_figures& l : n.links) {
      const int64_t ago_ms = now_ms - l.counts.last_stall_ms;
      if (l.counts.last_stall_ms <= 0 || ago_ms > 60'000) continue;
      out += (out.empty() ? "" : "; ") + std::string("node ") + n.addr.name + ": a " +
             (l.kind == link_kind::step ? "step link" : "KV landing") + " stalled " + std::to_string(std::max<int64_t>(ago_ms, 0) / 1000) +
             " s ago, " + std::to_string(l.counts.stalled) + " in all";
    }
  return out;
}

std::string render_status(const router_state& st) {
  using clock = std::chrono::system_clock;
  auto seconds = [](clock::time_point t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
  };
  nlohmann::json j;
  j["now"] = seconds(clock::now());
  j["started"] = seconds(st.started);
  j["outages"] = st.core->outages();
  j["failovers"] = st.core->failovers();
  j["resubmitted"] = st.core->resubmitted();
  j["replicas"] = nlohmann::json::array();
  for (size_t k = 0; k < st.replicas.size(); ++k) {
    const replica_slot& rep = st.replicas[k];
    const auto& view = st.core->replica(k);
    j["replicas"].push_back({{"name", rep.addr.name},
                             {"role", std::string(replica_role_name(view.role))},
                             {"ready", view.ready},
                             {"found", view.found},
                             {"detail", view.detail},
                             {"active", view.active},
                             {"kv_used", rep.kv_used},
                             {"kv_free", rep.kv_free},
                             {"running", rep.running},
                             {"waiting", rep.waiting}});
  }
  j["nodes"] = nlohmann::json::array();
  for (const node_slot& n : st.nodes) {
    nlohmann::json links = nlohmann::json::object();
    for (const wire::link_figures& l : n.links)
      links[std::string(link_kind_name(l.kind))] = {{"stalled", l.counts.stalled}, {"refused", l.counts.refused},
                                                     {"crowded", l.counts.crowded}};
    j["nodes"].push_back({{"name", n.addr.name}, {"answered", n.answered}, {"restarts", n.restarts}, {"links", links}});
  }
  j["events"] = nlohmann::json::array();
  for (const router_event& e : st.events) j["events"].push_back({{"at", seconds(e.at)}, {"what", e.what}});
  return j.dump();
}


}  // namespace troupe::router_actor_impl
