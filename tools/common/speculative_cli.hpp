// The speculative decoding options troupe-run and troupe-perf share
// (speculative_options.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include "tools/common/speculative_options.hpp"

namespace troupe::tools {

inline void add_speculative_options(CLI::App& app, speculative_options& o) {
  const char* group = "Speculative decoding";
  app.add_option("--speculative", o.method,
                 "ngram (prompt lookup), draft (a smaller model, --draft), early-exit (the model's first layers), "
                 "medusa or eagle (trained heads, --heads), or none; output is the model's own, token for token "
                 "when greedy")
      ->check(CLI::IsMember({"none", "ngram", "draft", "early-exit", "medusa", "eagle"}))
      ->group(group)
      ->capture_default_str();
  app.add_option("-k", o.k, "drafted tokens per step at most, 1..16 (default 3); adapts to acceptance")
      ->group(group);
  app.add_option("--draft", o.draft, "the draft model (--speculative draft): any format, the model's vocabulary")
      ->group(group);
  app.add_option("--heads", o.heads,
                 "the head file (--speculative medusa or eagle) that troupe-train made for this model")
      ->group(group);
  app.add_option("--tree", o.tree,
                 "verify a token tree instead of a chain: widths by depth, as 4,2,2 (4 candidates for the next "
                 "token, 2 under each for the one after, ...; at most 63 nodes), the proposer's top candidates "
                 "for each position along its most likely path; or auto[:NODES], the shape that keeps the most "
                 "drafts by the acceptance measured so far, within NODES (default 15)")
      ->group(group);
  app.add_option("--exit-layer", o.exit_layer, "early exit after this many layers (default: a quarter of them)")
      ->group(group);
}

}  // namespace troupe::tools
