// generator: runs a set of requests to completion on one whole model (one shard, every
// layer), batching every step: prompts are prefilled in chunks, then every unfinished
// sequence decodes one token per step, all in one forward pass. It is the engine loop for
// a single process (troupe-run, tests and benchmarks); the serving scheduler replaces its
// fixed block assignment with a shared pool.
//
// Request lifecycle:
//   prefilling --(last prompt chunk, first token sampled)--> decoding --(stop)--> finished
//
// One thread calls generate() at a time; the generator owns its thread pool.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/model/model.hpp"
#include "engine/sample/sampler.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

struct generation_request {
  std::vector<int32_t> prompt;            // token ids, BOS included where wanted
  sampling_params sampling;
  int32_t max_tokens = 256;               // generated tokens at most
  std::vector<int32_t> stop_tokens;       // besides EOS and BOS, which always stop
  std::vector<std::string> stop_strings;  // output text ends before the first one
  bool ignore_eos = false;                // run to max_tokens (benchmarks)
};

enum class finish_reason { stop, length };

struct generation_result {
  std::vector<int32_t> tokens;  // generated ids; a stop token is not included
  std::string text;             // their text, up to any stop string
  finish_reason reason = finish_reason::length;
  std::vector<sample_result> logprobs;  // per token, if the request asked for them
};

struct generator_options {
  int32_t num_threads = 1;
  int32_t block_size = 16;        // tokens per KV block
  int32_t max_step_tokens = 512;  // prefill chunk budget per step
};

// What one step produced for one request: its new token (-1 when the step ended the
// request with a stop token), the text that became final, and whether it is finished.
struct token_event {
  int32_t token = -1;
  std::string text;
  bool finished = false;
};

using token_callback = std::function<void(size_t request, const token_event& ev)>;

class generator {
 public:
  generator(const model& m, const tokenizer& tok, const generator_options& opts);

  expected<std::vector<generation_result>> generate(const std::vector<generation_request>& reqs,
                                                    const token_callback& on_token = {});

  thread_pool& pool() { return pool_; }

 private:
  const model& model_;
  const tokenizer& tok_;
  generator_options opts_;
  thread_pool pool_;
};

}  // namespace troupe
