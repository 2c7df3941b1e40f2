#include "tools/troupe-launch/chaos.hpp"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/agent_link.hpp"
#include "actors/caf/system_config.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/tls/node_links.hpp"
#include "actors/client/troupe_client.hpp"
#include "actors/wire/control_codec.hpp"
#include "tools/common/stats.hpp"

namespace troupe::tools {

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

std::map<std::string, int> read_pids(const std::string& table) {
  std::map<std::string, int> out;
  std::ifstream f(table);
  std::string node;
  int pid;
  while (f >> node >> pid) out[node] = pid;
  return out;
}

struct event_result {
  std::string kind, target;
  std::string actor_kind;  // of a killed actor: "stage", "kv-manager", ...
  std::string at;          // when it was injected, as the nodes' logs write time
  // Noticed: when the gateway saw the failure, by its own clock (its health's lastDownMs:
  // a replica stopped being ready), else when the harness did; seen: when the harness's
  // health call showed it (later, when the gateway answers late).
  double detect_ms = -1, seen_ms = -1, recover_ms = -1, first_token_ms = -1;
};

uint64_t unix_ms_now() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

// The wall-clock time now as the nodes' logs write it (local time, milliseconds), so that
// an event can be found in them.
std::string log_time_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[40];
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03lld", static_cast<long long>(ms));
  return buf;
}

// What a node's agent says of its actors, if it answers within 2 s.
std::optional<wire::node_health> agent_health(caf::scoped_actor& self, const caf::actor& agent) {
  std::optional<wire::node_health> out;
  self->request(agent, std::chrono::seconds(2), health_atom_v)
      .receive(
          [&](const wire_message& m) {
            if (!m.bytes) return;
            if (auto h = wire::decode_node_health(*m.bytes)) out = std::move(h).value();
          },
          [](caf::error&) {});
  return out;
}

// With [tls], troupe-launch reaches node agents as the cluster's operator, with its own
// certificate: its TLS context (none without [tls]), or nothing, having said why, when its
// files are missing or wrong.
std::optional<std::shared_ptr<tls::context>> operator_tls(const topology& topo) {
  if (!topo.tls.on()) return std::shared_ptr<tls::context>{};
  auto ctx = tls::context::load({topo.tls.ca, topo.tls.cert_of(tls_section::operator_name),
                                 topo.tls.key_of(tls_section::operator_name)});
  if (!ctx) {
    std::fprintf(stderr, "troupe-launch: [tls]: %s (troupe-launch certs %s makes it)\n", ctx.err().message.c_str(),
                 topo.path.c_str());
    return std::nullopt;
  }
  return *ctx;
}

}  // namespace

int print_actors(const topology& topo) {
  system_config cfg(failure_detection{std::chrono::milliseconds(topo.failure.heartbeat_ms),
                                       std::chrono::milliseconds(topo.failure.timeout_ms)});
  const auto tls_ctx = operator_tls(topo);
  if (!tls_ctx) return 1;
  caf::actor_system sys{cfg};
  node_links_scope links(sys, *tls_ctx);
  caf::scoped_actor self{sys};
  int rc = 0;
  for (const auto& n : topo.nodes) {
    auto agent = connect_agent(sys, n.host, n.port);
    const auto h = agent ? agent_health(self, *agent) : std::nullopt;
    const bool answered = h.has_value();
    if (h)
      for (auto& a : h->actors)
        std::printf("actor %s node %s kind %s %s restarts %u\n", a.name.c_str(), n.name.c_str(),
                    wire::actor_kind_name(a.kind), a.alive ? "alive" : "dead", a.restarts);
    if (!answered) {
      std::printf("node %s does not answer at %s:%u\n", n.name.c_str(), n.host.c_str(), static_cast<unsigned>(n.port));
      rc = 1;
    }
  }
  return rc;
}

int run_chaos(const topology& topo, const std::string& endpoint, const std::string& table_file, const chaos_options& opt) {
  system_config cfg(failure_detection{std::chrono::milliseconds(topo.failure.heartbeat_ms),
                                       std::chrono::milliseconds(topo.failure.timeout_ms)});
  const auto tls_ctx = operator_tls(topo);
  if (!tls_ctx) return 1;
  caf::actor_system sys{cfg};
  node_links_scope links(sys, *tls_ctx);
  caf::scoped_actor self{sys};
  auto client = troupe_client::connect(endpoint, "", topo.tls.ca);
  uint64_t outages = 0;    // the gateway's count when it was last seen whole
  uint64_t last_down = 0;  // when a replica last stopped being ready, as it said then
  // `down_at`: when the gateway says a replica last stopped being ready, if later than when
  // it was last seen whole (0: not since).
  auto whole = [&](bool* noticed = nullptr, uint64_t* down_at = nullptr) {
    auto h = client->health();
    if (!h) return false;
    const bool all = h->replicas > 0 && h->replicas_ready == h->replicas;
    // An outage counted, or a replica down, since the last look was seen by the gateway,
    // however brief.
    if (noticed) *noticed = !all || h->outages > outages || h->last_down_ms > last_down;
    if (down_at) *down_at = h->last_down_ms > last_down ? h->last_down_ms : 0;
    if (all) {
      outages = h->outages;
      last_down = h->last_down_ms;
    }
    return all;
  };
  // Waits until every replica is ready; false after the timeout.
  auto wait_whole = [&](int timeout_s) {
    const auto until = clock_type::now() + std::chrono::seconds(timeout_s);
    while (clock_type::now() < until) {
      if (whole()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  // Every node but a lone gateway's: with several gateways, they are targets too (the
  // harness's client fails over between them).
  std::vector<const node_spec*> targets;
  for (const auto& n : topo.nodes)
    if (n.name != topo.gateway.node || !topo.gateway.also.empty()) targets.push_back(&n);
  if (targets.empty()) {
    std::fprintf(stderr, "troupe-launch chaos: every actor runs on the gateway's node; nothing to inject into\n");
    return 2;
  }
  if (!wait_whole(opt.recover_timeout_s)) {
    std::fprintf(stderr, "troupe-launch chaos: the cluster is not whole to begin with\n");
    return 1;
  }
  std::mt19937_64 rng(opt.seed);
  std::vector<event_result> results;
  std::vector<std::pair<clock_type::time_point, int>> resumes;  // stopped nodes, when to resume
  auto resume_due = [&](bool all = false) {
    for (auto it = resumes.begin(); it != resumes.end();)
      if (all || clock_type::now() >= it->first) {
        kill(it->second, SIGCONT);
        it = resumes.erase(it);
      } else {
        ++it;
      }
  };
  int failures = 0, unseen = 0;
  for (int e = 0; e < opt.events; ++e) {
    const auto gap_until = clock_type::now() + std::chrono::milliseconds(
        opt.min_gap_ms + static_cast<int>(rng() % static_cast<uint64_t>(std::max(1, opt.max_gap_ms - opt.min_gap_ms + 1))));
    while (clock_type::now() < gap_until) {
      resume_due();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    event_result r;
    // Half the events kill actors (when enabled): they come in more kinds than processes.
    const bool has_actor = std::find(opt.kinds.begin(), opt.kinds.end(), "actor") != opt.kinds.end();
    std::vector<std::string> others;
    for (const auto& k : opt.kinds)
      if (k != "actor") others.push_back(k);
    r.kind = has_actor && (others.empty() || rng() % 2 == 0) ? "actor" : others[rng() % others.size()];
    const node_spec* pick = targets[rng() % targets.size()];
    // A gateway is killed, never stopped: the harness's own calls to a stopped gateway would
    // wait for it, and it is the harness that resumes it.
    if (r.kind == "sigstop" && topo.gateway.index_of(pick->name) >= 0) r.kind = "sigkill";
    const node_spec& node = *pick;
    // The supervisor may be rewriting the table for a restarted node: look again briefly.
    int pid = 0;
    for (int tries = 0; tries < 100 && pid <= 0; ++tries) {
      const auto pids = read_pids(table_file);
      pid = pids.count(node.name) ? pids.at(node.name) : 0;
      if (pid <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    clock_type::time_point t0;
    uint64_t t0_unix = 0;
    if (r.kind == "actor") {
      // Ask the node's agent what runs there, and kill one of its actors.
      // A kind of actor first (so shards, stages and schedulers all get their turn), then one
      // of it. A node that has just restarted may take a moment to answer.
      std::map<wire::actor_kind, std::vector<std::string>> by_kind;
      caf::expected<caf::actor> agent{caf::actor{}};
      for (int tries = 0; tries < 10 && by_kind.empty(); ++tries) {
        if (tries > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        agent = connect_agent(sys, node.host, node.port);
        if (!agent) continue;
        if (auto h = agent_health(self, *agent))
          for (auto& a : h->actors)
            if (a.alive) by_kind[a.kind].push_back(a.name);
      }
      std::vector<std::string> names;
      if (!by_kind.empty()) {
        const auto picked = std::next(by_kind.begin(), static_cast<ptrdiff_t>(rng() % by_kind.size()));
        names = picked->second;
        r.actor_kind = wire::actor_kind_name(picked->first);
      }
      if (names.empty()) {
        // Not a failure of the cluster's (in overlap mode the node may be down): skipped.
        std::printf("chaos %d: node %s has no live actor to kill (skipped)\n", e + 1, node.name.c_str());
        continue;
      }
      const std::string victim = names[rng() % names.size()];
      r.target = victim + " on node " + node.name;
      t0 = clock_type::now();
      t0_unix = unix_ms_now();
      r.at = log_time_now();
      std::string refused;
      self->request(*agent, std::chrono::seconds(2), kill_atom_v, victim)
          .receive([&](bool killed) { refused = killed ? "" : "no live actor of that name"; },
                   [&](caf::error& err) { refused = sys.render(err); });
      if (!refused.empty()) {
        std::printf("chaos %d: actor   %-40s not killed: %s\n", e + 1, r.target.c_str(), refused.c_str());
        continue;
      }
    } else {
      if (pid <= 0) {
        std::printf("chaos %d: node %s has no known pid in %s\n", e + 1, node.name.c_str(), table_file.c_str());
        ++failures;
        continue;
      }
      r.target = "node " + node.name + " (pid " + std::to_string(pid) + ")";
      t0 = clock_type::now();
      t0_unix = unix_ms_now();
      r.at = log_time_now();
      if (kill(pid, r.kind == "sigkill" ? SIGKILL : SIGSTOP) != 0) {
        // Gone already (a restart the table does not show yet): nothing was injected.
        std::printf("chaos %d: %-7s %-40s not sent: %s\n", e + 1, r.kind.c_str(), r.target.c_str(), std::strerror(errno));
        continue;
      }
    }
    if (opt.overlap) {
      // Failures pile up: nothing is waited for or timed; a stopped node resumes on time.
      if (r.kind == "sigstop") resumes.push_back({t0 + std::chrono::milliseconds(opt.stop_ms), pid});
      std::printf("chaos %d: %-7s %s\n", e + 1, r.kind.c_str(), r.target.c_str());
      std::fflush(stdout);
      results.push_back(r);
      resume_due();
      continue;
    }
    // Noticed: the gateway reports a replica not ready, or an outage it counted since, or
    // a replica down since. Timed by the gateway's clock where it says when (on one host,
    // the harness's own), as its answer may come late: a gateway streaming at the limit of
    // its CPU answers a health call hundreds of milliseconds after it noticed.
    const auto notice_by = t0 + std::chrono::milliseconds(std::max(3000, 10 * topo.failure.timeout_ms));
    while (clock_type::now() < notice_by) {
      bool noticed = false;
      uint64_t down_at = 0;
      (void)whole(&noticed, &down_at);
      if (noticed) {
        r.seen_ms = ms_since(t0);
        // (Two milliseconds of slack for the gateway's conversion of its clock.)
        r.detect_ms = down_at + 2 >= t0_unix
                          ? std::min(r.seen_ms, std::max(0.0, static_cast<double>(down_at) - static_cast<double>(t0_unix)))
                          : r.seen_ms;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (r.kind == "sigstop") {
      std::this_thread::sleep_until(t0 + std::chrono::milliseconds(opt.stop_ms));
      kill(pid, SIGCONT);
    }
    if (wait_whole(opt.recover_timeout_s)) {
      r.recover_ms = ms_since(t0);
      // A fresh request once the cluster is whole: when its first token comes.
      request_params probe;
      probe.sampling.temperature = 0.0f;
      probe.max_tokens = 1;
      auto got = client->generate("Once upon a time", probe, false, [&](const client_chunk& c) {
        if (r.first_token_ms < 0 && !c.tokens.empty()) r.first_token_ms = ms_since(t0);
      });
      if (got && r.first_token_ms < 0 && !got->tokens.empty()) r.first_token_ms = ms_since(t0);
    }
    if (r.recover_ms < 0) ++failures;
    if (r.detect_ms < 0) ++unseen;
    char line[512];
    auto ms = [](double v) { return v < 0 ? std::string("never") : std::to_string(static_cast<int>(v)) + " ms"; };
    std::snprintf(line, sizeof line,
                  "chaos %d: %-7s %-40s noticed %s (a client saw it after %s), whole again after %s, a new request's "
                  "first token after %s",
                  e + 1, r.kind.c_str(), r.target.c_str(), ms(r.detect_ms).c_str(), ms(r.seen_ms).c_str(),
                  ms(r.recover_ms).c_str(), ms(r.first_token_ms).c_str());
    std::printf("%s\n", line);
    std::fflush(stdout);
    results.push_back(r);
  }
  if (opt.overlap) {
    // Every stopped node resumed; then the whole cluster must come back.
    const auto last = clock_type::now();
    while (!resumes.empty()) {
      std::this_thread::sleep_until(resumes.front().first);
      resume_due();
    }
    const bool back = wait_whole(opt.recover_timeout_s);
    std::printf("\nchaos: %d overlapping event(s); whole again %s after the last\n", opt.events,
                back ? (std::to_string(static_cast<int>(ms_since(last))) + " ms").c_str() : "never");
    return back ? 0 : 1;
  }
  // Per kind: how fast failures are noticed and repaired.
  std::printf("\n| failure | events | noticed p50 / max (ms) | seen by a client p50 / max (ms) | whole again p50 / max (ms) "
              "| first token after p50 / max (ms) |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
  // Actor kills get a row per kind of actor, after one for them all.
  std::vector<std::pair<std::string, std::string>> rows;  // kind, actor kind ("" for all)
  for (const auto& kind : opt.kinds) {
    rows.emplace_back(kind, "");
    if (kind != "actor") continue;
    std::set<std::string> actor_kinds;
    for (const auto& r : results)
      if (r.kind == kind && !r.actor_kind.empty()) actor_kinds.insert(r.actor_kind);
    for (const auto& a : actor_kinds) rows.emplace_back(kind, a);
  }
  for (const auto& [kind, actor_kind] : rows) {
    std::vector<double> d, seen, rc, ft;
    for (const auto& r : results)
      if (r.kind == kind && (actor_kind.empty() || r.actor_kind == actor_kind) && r.detect_ms >= 0 && r.recover_ms >= 0) {
        d.push_back(r.detect_ms);
        seen.push_back(r.seen_ms);
        rc.push_back(r.recover_ms);
        if (r.first_token_ms >= 0) ft.push_back(r.first_token_ms);
      }
    if (d.empty()) continue;
    const std::string label = actor_kind.empty() ? kind : kind + ": " + actor_kind;
    std::printf("| %s | %zu | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f |\n", label.c_str(), d.size(),
                percentile(d, 50), percentile(d, 100), percentile(seen, 50), percentile(seen, 100), percentile(rc, 50),
                percentile(rc, 100), percentile(ft, 50), percentile(ft, 100));
  }
  if (!opt.json_path.empty()) {
    std::ofstream j(opt.json_path);
    j << "[";
    for (size_t i = 0; i < results.size(); ++i)
      j << (i ? ",\n " : "") << "{\"kind\":\"" << results[i].kind << "\",\"actor\":\"" << results[i].actor_kind
        << "\",\"target\":\"" << results[i].target << "\",\"at\":\"" << results[i].at
        << "\",\"detect_ms\":" << results[i].detect_ms << ",\"seen_ms\":" << results[i].seen_ms
        << ",\"recover_ms\":" << results[i].recover_ms << ",\"first_token_ms\":" << results[i].first_token_ms << "}";
    j << "]\n";
  }
  std::printf("\nchaos: %d event(s), %d not recovered, %d repaired before the gateway's health showed it; heartbeat %d ms, "
              "timeout %d ms\n",
              opt.events, failures, unseen, topo.failure.heartbeat_ms, topo.failure.timeout_ms);
  return failures == 0 ? 0 : 1;
}

}  // namespace troupe::tools
