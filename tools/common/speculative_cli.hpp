// The speculative decoding options troupe-run and troupe-perf share, and the
// configuration they make (engine/spec/speculative.hpp).
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/model/model.hpp"
#include "engine/spec/speculative.hpp"
#include "engine/util/expected.hpp"

namespace troupe::tools {

struct speculative_cli {
  std::string method = "none";
  int32_t k = -1;         // -1: the method's default
  std::string draft;
  int32_t exit_layer = 0; // 0: a quarter of the target's layers
};

inline void add_speculative_options(CLI::App& app, speculative_cli& o) {
  const char* group = "Speculative decoding";
  app.add_option("--speculative", o.method,
                 "ngram (prompt lookup), draft (a smaller model, --draft), early-exit (the model's first layers), "
                 "or none; output is the model's own, token for token when greedy")
      ->check(CLI::IsMember({"none", "ngram", "draft", "early-exit"}))
      ->group(group)
      ->capture_default_str();
  app.add_option("-k", o.k, "drafted tokens per step at most, 1..16 (default 3); adapts to acceptance")
      ->group(group);
  app.add_option("--draft", o.draft, "the draft model (--speculative draft): any format, the model's vocabulary")
      ->group(group);
  app.add_option("--exit-layer", o.exit_layer, "early exit after this many layers (default: a quarter of them)")
      ->group(group);
}

// The configuration for `target`; with method draft, the draft model is loaded into
// `draft` and checked against the target. An error in words.
expected<speculative_config> speculative_from(const speculative_cli& o, const model& target, std::optional<model>& draft);

}  // namespace troupe::tools
