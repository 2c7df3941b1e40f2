// The quality of KV eviction: seeded generations with each policy and budget, and the
// perplexity the full-cache model assigns to what they generated, against the full
// cache's own generations from the same seeds; how often their 4-grams repeat; and
// streaming far past the context, segment by segment. Prints Markdown tables.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model.hpp"
#include "engine/tokenizer/tokenizer.hpp"

namespace troupe::tools {

struct eviction_bench_options {
  int32_t texts = 8;                 // seeded generations per row
  int32_t length = 0;                // tokens each generates (0: the context, less the prompt)
  std::vector<int32_t> budgets{20, 50};  // percent of length
  std::vector<std::string> policies{"streaming", "h2o", "scissorhands"};
  int32_t long_factor = 4;           // streaming runs this many contexts long
  float temperature = 1.0f;
  int32_t threads = 1;
};

void run_eviction_bench(const model& m, const tokenizer& tok, const eviction_bench_options& o);

}  // namespace troupe::tools
