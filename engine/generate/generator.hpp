// generator: runs a set of requests to completion on the serving loop (llm_engine) and
// collects their outputs: for troupe-run, tests and benchmarks. The KV pool is sized so
// that every request fits at once unless options say otherwise.
//
// One thread calls generate() at a time.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/model.hpp"
#include "engine/serve/llm_engine.hpp"
#include "engine/tokenizer/tokenizer.hpp"

namespace troupe {

using generation_request = request_params;

struct generation_result {
  std::vector<int32_t> tokens;  // generated ids; a stop token is not included
  std::string text;             // their text, up to any stop string
  finish_reason reason = finish_reason::length;
  std::vector<sample_result> logprobs;  // per token, if the request asked for them
};

struct generator_options {
  int32_t num_threads = 1;
  int32_t block_size = 16;        // tokens per KV block
  int32_t max_step_tokens = 512;  // tokens per step, decode and prefill together
  int32_t max_running = 256;
  uint32_t num_blocks = 0;        // 0: enough for every request at once
  bool prefix_caching = true;
  std::optional<dtype> kv_type;   // the KV cache's (default: kv_cache_type_for)
  speculative_config spec;        // speculative decoding (engine/speculative/speculative.hpp)
  const model* draft = nullptr;   // the draft model, for spec.method draft
  const speculative_heads* heads = nullptr;  // the head file, for medusa and eagle
  kv_eviction_config eviction;    // KV eviction (engine/kv/kv_eviction.hpp)
};

// What one step produced for one request: its new tokens (one, more with speculative
// decoding, none when the step ended the request without one), the text that became
// final, and whether it is finished.
struct token_event {
  std::vector<int32_t> tokens;
  std::string text;
  bool finished = false;
};

using token_callback = std::function<void(size_t request, const token_event& ev)>;

class generator {
 public:
  generator(const model& m, const tokenizer& tok, const generator_options& opts);

  expected<std::vector<generation_result>> generate(const std::vector<generation_request>& reqs,
                                                    const token_callback& on_token = {});

  // Counters of the last generate() call.
  const engine_stats& last_stats() const { return stats_; }

 private:
  const model& model_;
  const tokenizer& tok_;
  generator_options opts_;
  engine_stats stats_;
};

}  // namespace troupe
