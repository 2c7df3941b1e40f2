// request: one generation request as the scheduler tracks it.
//
//   waiting --admit--> running --stop / max tokens--> finished
//      ^                  |
//      +----preempt-------+          (any state) --abort--> finished (aborted)
//
// tokens holds the prompt then every generated token. num_computed_tokens of them have
// their KV in the cache; the scheduler closes the gap to num_tokens() each step, which
// covers prefill, chunked prefill, prefix hits (num_computed starts at the hit length)
// and resumption after preemption (num_computed back to 0, the tokens kept).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/generate/stop_matcher.hpp"
#include "engine/kv/block_id.hpp"
#include "engine/sample/sampler.hpp"
#include "engine/tokenizer/utf8_stream.hpp"

namespace troupe {

enum class request_state : uint8_t { waiting, running, finished };
enum class finish_reason : uint8_t { none, stop, length, aborted };

std::string_view finish_reason_name(finish_reason r);

// What a client asks for.
struct request_params {
  std::vector<int32_t> prompt;            // token ids, BOS included where wanted
  sampling_params sampling;
  int32_t max_tokens = 256;               // generated tokens at most
  std::vector<int32_t> stop_tokens;       // besides EOS and BOS, which always stop
  std::vector<std::string> stop_strings;  // output text ends before the first one
  bool ignore_eos = false;                // run to max_tokens (benchmarks)
  int32_t priority = 0;                   // lower runs first under the priority policy
  uint64_t cache_namespace = 0;           // prefix-cache isolation key (per tenant)
  std::vector<int32_t> delivered;         // output an earlier attempt already streamed (a
                                          // request moved off a failed replica): replayed
                                          // through sampler, detokenizer and stop strings,
                                          // counted as output, never streamed again
};

struct request {
  request_id id;
  request_params params;
  std::vector<int32_t> tokens;  // prompt, then output
  int32_t num_prompt_tokens = 0;
  int32_t num_computed_tokens = 0;
  uint64_t arrival = 0;         // admission order, for FCFS and ties
  request_state state = request_state::waiting;
  finish_reason reason = finish_reason::none;
  int32_t num_preemptions = 0;
  int32_t num_cached_prompt_tokens = 0;  // prefix-cache hit at first admission
  bool in_flight = false;  // a step computing this request has not come back yet
  std::vector<block_id> blocks;  // its KV blocks, as the block manager granted them
  sampler smp;
  utf8_stream utf8;
  stop_matcher stops;

  request(request_id i, request_params p, uint64_t arrival_seq)
      : id(i), params(std::move(p)), tokens(params.prompt),
        num_prompt_tokens(static_cast<int32_t>(params.prompt.size())), arrival(arrival_seq),
        smp(params.sampling, params.prompt), stops(params.stop_strings) {}

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
};

}  // namespace troupe
