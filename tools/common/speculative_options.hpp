// The speculative decoding options, as troupe-run and troupe-perf take them on the
// command line (speculative_cli.hpp) and a topology's [speculative] table names them,
// and the configuration they make (engine/speculative/speculative.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/model/model.hpp"
#include "engine/speculative/heads.hpp"
#include "engine/speculative/speculative.hpp"
#include "engine/util/expected.hpp"

namespace troupe::tools {

struct speculative_options {
  std::string method = "none";  // ngram, draft, early-exit, medusa, eagle or none
  int32_t k = -1;               // -1: the method's default
  std::string draft;            // the draft model's file, for method draft
  int32_t exit_layer = 0;       // 0: a quarter of the target's layers
  std::string heads;            // the head file, for methods medusa and eagle
  std::string tree;             // a token tree's widths by depth, "4,2,2"; empty: a chain
  int32_t max_step_tokens = 0;  // a step's decode tokens and drafts at most (0: the default)
};

// What a speculative configuration loads: a draft model, or trained heads.
struct speculative_models {
  std::optional<model> draft;
  std::unique_ptr<speculative_heads> heads;
};

// The configuration for a target of shape `target`, without loading anything: the first
// mistake in words, naming the options as `flag` spells them ("--exit-layer" on the
// command line, "exit_layer" in a topology).
expected<speculative_config> speculative_config_of(const speculative_options& o, const model_config& target,
                                                   bool topology = false);

// The same, and with method draft the draft model loaded and checked against the target;
// with medusa or eagle, the head file (checked against target_vocab too, where given).
expected<speculative_config> speculative_from(const speculative_options& o, const model& target,
                                              const vocabulary* target_vocab, speculative_models& loaded,
                                              bool topology = false);

}  // namespace troupe::tools
