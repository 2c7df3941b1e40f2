// The speculative decoding options, as troupe-run and troupe-perf take them on the
// command line (speculative_cli.hpp) and a topology's [speculative] table names them,
// and the configuration they make (engine/spec/speculative.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/model/model.hpp"
#include "engine/spec/speculative.hpp"
#include "engine/util/expected.hpp"

namespace troupe::tools {

struct speculative_options {
  std::string method = "none";  // ngram, draft, early-exit or none
  int32_t k = -1;               // -1: the method's default
  std::string draft;            // the draft model's file, for method draft
  int32_t exit_layer = 0;       // 0: a quarter of the target's layers
};

// The configuration for a target of shape `target`, without loading anything: the first
// mistake in words, naming the options as `flag` spells them ("--exit-layer" on the
// command line, "exit_layer" in a topology).
expected<speculative_config> speculative_config_of(const speculative_options& o, const model_config& target,
                                                   bool topology = false);

// The same, and with method draft the draft model loaded into `draft` and checked against
// the target.
expected<speculative_config> speculative_from(const speculative_options& o, const model& target,
                                              std::optional<model>& draft, bool topology = false);

}  // namespace troupe::tools
