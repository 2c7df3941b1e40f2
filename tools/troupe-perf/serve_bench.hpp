// The serving benchmark of one engine instance: a closed loop that keeps `concurrency`
// requests in the engine (a new one as each finishes) and times every request's first
// token and the gaps after it, as a client of the engine loop would see them: their mean per
// request (TPOT) and each one (ITL, where a step that prefills a long chunk shows as a
// stall of every running request).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/serve/llm_engine.hpp"

#include "tools/common/stats.hpp"

namespace troupe::tools {

struct serve_workload {
  int32_t concurrency = 1;
  int32_t num_requests = 8;
  int32_t prompt_tokens = 128;   // per request, BOS included
  int32_t output_tokens = 128;   // generated per request (EOS ignored)
  int32_t shared_prefix = 0;     // leading prompt tokens every request shares
  uint64_t seed = 1;
};

struct serve_result {
  double seconds = 0;
  int64_t output_tokens = 0;
  double output_tokens_per_s = 0;
  std::vector<double> ttft_ms;   // per request
  std::vector<double> tpot_ms;   // per request: (last - first token) / (tokens - 1)
  std::vector<double> itl_ms;    // every gap between two tokens of a request
  uint64_t prompt_tokens_computed = 0;
  uint64_t prefix_hit_tokens = 0;
};

serve_result run_serve(llm_engine& engine, const serve_workload& w, int32_t vocab, int32_t bos);

double mean(const std::vector<double>& v);

}  // namespace troupe::tools
