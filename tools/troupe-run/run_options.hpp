// troupe-run's command line: what to generate and how, and the flags that set it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tools/common/eviction_cli.hpp"
#include "tools/common/speculative_cli.hpp"

namespace troupe::tools {

struct run_options {
  std::string model_path, tokenizer_path, prompt;
  int32_t steps = 256, threads = 0, top_k = 0, logprobs = -1;
  float temperature = 1.0f, top_p = 0.9f, min_p = 0.0f, rep = 1.0f, freq = 0.0f, pres = 0.0f;
  int64_t seed = -1;
  std::vector<std::string> stops, biases;
  bool ids = false, quiet = false, ignore_eos = false;
  speculative_options spec;
  eviction_options eviction;
};

// Adds every flag of `o` to `app`.
void add_run_options(CLI::App& app, run_options& o);

// Loads the model, generates, prints the text as it comes and a summary on stderr.
// The exit status: 0, or 1 with the reason on stderr.
int run(const run_options& o);

}  // namespace troupe::tools
