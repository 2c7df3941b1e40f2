// client_codec: the client API's messages (schema/client.capnp) to and from engine types:
// a GenerateRequest becomes request_params (text prompts tokenized, BOS prepended, every
// field range-checked), a step's output becomes a TokenChunk, a finished request a
// GenerateResult.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/sched/step_plan.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "engine/util/expected.hpp"
#include "schema/client.capnp.h"

namespace troupe::wire {

struct request_limits {
  int32_t context = 0;            // prompt + output tokens at most
  int32_t max_prompt_bytes = 1 << 20;
  int32_t max_stop_strings = 16;
};

expected<request_params> decode_generate_request(std::span<const uint8_t> bytes, const tokenizer& tok,
                                                 const request_limits& lim);
std::vector<uint8_t> encode_generate_request_text(const std::string& prompt, const request_params& p);
// Fills a request under construction (an RPC call's parameters, say).
void fill_generate_request(schema::GenerateRequest::Builder r, const std::string& prompt, const request_params& p,
                           bool steps_include_prompt);

std::vector<uint8_t> encode_token_chunk(uint64_t request, uint32_t seq, const step_output& out);
std::vector<uint8_t> encode_generate_result(uint64_t request, const step_output& last, uint32_t chunks,
                                            const std::string& error_text = "");

struct chunk_view {
  uint64_t request = 0;
  uint32_t seq = 0;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<sample_result> logprobs;  // per token, when the request asked for them
};
expected<chunk_view> decode_token_chunk(std::span<const uint8_t> bytes);

struct result_view {
  uint64_t request = 0;
  finish_reason reason = finish_reason::none;
  uint32_t prompt_tokens = 0, output_tokens = 0, chunks = 0;
  std::string error;
};
expected<result_view> decode_generate_result(std::span<const uint8_t> bytes);

}  // namespace troupe::wire
