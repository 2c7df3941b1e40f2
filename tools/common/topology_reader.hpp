// The topology parser's reader (toml++ values with file and line in every error, unknown
// keys with the nearest known one) and its section parsers, shared by topology.cpp (the
// whole file, its names and its checks against the model) and topology_sections.cpp (one
// table each). Internal to tools/common.
#pragma once

#include <algorithm>
#include <array>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "tools/common/topology.hpp"

namespace troupe::tools::topology_impl {

using keys = std::initializer_list<std::string_view>;

inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Reads values out of the parsed file; the first mistake found is kept, with the file and
// the line it is on.
class reader {
 public:
  explicit reader(std::string file) : file_(std::move(file)) {}

  bool ok() const { return error_.empty(); }
  const std::string& error_message() const { return error_; }

  // A mistake at `at`'s line (the file alone where there is none to point at).
  bool fail(const toml::node* at, const std::string& what) {
    if (!error_.empty()) return false;
    error_ = file_;
    if (at && at->source().begin.line > 0) error_ += ":" + std::to_string(at->source().begin.line);
    error_ += ": " + what;
    return false;
  }

  // Every key of `t` is one of `known`.
  bool only(const toml::table& t, const std::string& where, keys known) {
    for (const auto& [k, v] : t) {
      const std::string_view key = k.str();
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string hint, list;
      size_t best = 3;
      for (std::string_view c : known) {
        list += (list.empty() ? "" : ", ") + std::string(c);
        if (const size_t d = edit_distance(key, c); d < best) best = d, hint = c;
      }
      return fail(&v, where + ": unknown key '" + std::string(key) + "'" +
                          (hint.empty() ? " (it takes " + list + ")" : "; did you mean '" + hint + "'?"));
    }
    return true;
  }

  template <class T>
  bool get(const toml::table& t, const std::string& where, const char* key, T& out, bool required = false) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) fail(&t, where + ": '" + key + "' is missing");
      return false;
    }
    if constexpr (std::is_same_v<T, std::string>) {
      if (auto v = n->value<std::string>()) {
        out = *v;
        return true;
      }
      fail(n, where + ": '" + key + "' must be a string");
    } else if constexpr (std::is_same_v<T, bool>) {
      // A boolean node only: toml++'s value<bool>() takes an integer as well (1: true).
      if (const auto* b = n->as_boolean()) {
        out = b->get();
        return true;
      }
      fail(n, where + ": '" + key + "' must be true or false");
    } else {
      // An integer node only: toml++'s value<int64_t>() converts a float as well, with
      // undefined behaviour past int64's range (7.4e31 did).
      if (const auto* i = n->as_integer()) {
        const int64_t v = i->get();
        // (Negative only where the key's type takes a sign: [[class]] priority.)
        const int64_t lowest = std::is_signed_v<T> ? INT32_MIN : 0;
        if (v < lowest || v > INT32_MAX) return fail(n, where + ": '" + key + "' = " + std::to_string(v) + " is out of range");
        out = static_cast<T>(v);
        return true;
      }
      fail(n, where + ": '" + key + "' must be an integer");
    }
    return false;
  }

  // An integer key within [lo, hi], or a mistake saying so.
  template <class T>
  void get_in(const toml::table& t, const std::string& where, const char* key, T& out, int64_t lo, int64_t hi) {
    if (get(t, where, key, out) && (int64_t{out} < lo || int64_t{out} > hi))
      fail(t.get(key), where + ": " + key + " must be in " + std::to_string(lo) + ".." + std::to_string(hi));
  }

  bool port_of(int64_t v, const toml::node* at, const std::string& where, uint16_t& out) {
    if (v < 1 || v > 65535) return fail(at, where + ": port " + std::to_string(v) + " is not in 1..65535");
    out = static_cast<uint16_t>(v);
    return true;
  }

  bool host_ok(const std::string& h, const toml::node* at, const std::string& where) {
    if (h.empty() || h.size() > 253 ||
        h.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != std::string::npos)
      return fail(at, where + ": host '" + h + "' is not a host name or IPv4 address");
    return true;
  }

  bool endpoint_of(const toml::table& t, const std::string& where, const char* key, endpoint& out, bool required) {
    std::string s;
    if (!get(t, where, key, s, required)) return false;
    const toml::node* at = t.get(key);
    const std::string what = where + " " + key;
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos || colon == 0) return fail(at, what + ": '" + s + "' is not HOST:PORT");
    out.host = s.substr(0, colon);
    const std::string port = s.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
      return fail(at, what + ": '" + s + "' has no valid port");
    return port_of(std::stol(port), at, what, out.port) && host_ok(out.host, at, what);
  }

 private:
  std::string file_;
  std::string error_;
};

// The tables of a topology, and what each may hold.
constexpr std::array<std::string_view, 13> top_tables = {"model", "gateway",     "kv",   "scheduler", "failure",
                                                         "router", "gpu",       "speculative", "tls",  "node",
                                                         "replica", "tier",     "class"};

model_section parse_model(reader& rd, const toml::table& t, const std::string& base_dir);
gateway_section parse_gateway(reader& rd, const toml::table& t, const std::string& base_dir);
kv_config parse_kv(reader& rd, const toml::table& t);
// One [[tier]] of the KV cache below the pool, in the order given.
tier_config parse_tier(reader& rd, const toml::table& t, const std::string& w, const std::string& base_dir);
// [kv]'s eviction keys, under any of their spellings.
kv_eviction_config parse_kv_eviction(reader& rd, const toml::table& t);
scheduler_config parse_scheduler(reader& rd, const toml::table& t, const std::vector<slo_class>& classes);
failure_config parse_failure(reader& rd, const toml::table& t);
slo_class parse_class(reader& rd, const toml::table& t, const std::string& w);
router_section parse_router(reader& rd, const toml::table& t);
gpu_config parse_gpu(reader& rd, const toml::table& t);
tls_section parse_tls(reader& rd, const toml::table& t, const std::string& base_dir);
speculative_options parse_speculative(reader& rd, const toml::table& t, const std::string& base_dir);
// tls_on: the topology has a [tls] table (without one, a node off loopback is refused
// unless it says insecure_internal_ports = true).
node_spec parse_node(reader& rd, const toml::table& t, const std::string& where, bool tls_on);
replica_spec parse_replica(reader& rd, const toml::table& t, const std::string& where);

}  // namespace troupe::tools::topology_impl
