// The KV eviction options troupe-run and troupe-perf share (engine/kv/kv_eviction.hpp).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "engine/kv/kv_eviction.hpp"
#include "engine/model/config.hpp"
#include "engine/util/expected.hpp"

namespace troupe::tools {

struct eviction_options {
  std::string policy = "none";
  kv_eviction_config config;
};

inline void add_eviction_options(CLI::App& app, eviction_options& o) {
  const char* group = "KV eviction";
  app.add_option("--kv-policy", o.policy,
                 "decode within --kv-budget: none, streaming (attention sinks and a recent window; generates past the "
                 "context), h2o (heavy hitters and recent tokens), scissorhands (tokens whose importance persists, "
                 "and recent ones)")
      ->group(group)
      ->capture_default_str();
  app.add_option("--kv-budget", o.config.budget, "cached tokens per request at most")->group(group);
  app.add_option("--sinks", o.config.sinks, "streaming: first tokens always kept (default 4)")->group(group);
  app.add_option("--window", o.config.window,
                 "recent tokens always kept (default: streaming, the rest of the budget; h2o and scissorhands, half "
                 "of it)")
      ->group(group);
}

// The configuration for a model of shape m: the first mistake in words.
inline expected<kv_eviction_config> eviction_config_of(const eviction_options& o, const model_config& m) {
  kv_eviction_config c = o.config;
  const auto p = parse_kv_policy(o.policy);
  if (!p) return error{"--kv-policy: '" + o.policy + "' is none, streaming, h2o or scissorhands"};
  c.policy = *p;
  if (auto bad = validate(c)) return error{*bad};
  if (c.enabled() && c.budget > m.max_seq_len)
    return error{"--kv-budget " + std::to_string(c.budget) + " is past the model's context of " +
                 std::to_string(m.max_seq_len)};
  return c;
}

}  // namespace troupe::tools
