// client_codec: the client API's messages (schema/client.capnp) to and from engine types:
// a GenerateRequest becomes request_params (text prompts tokenized, BOS prepended, every
// field range-checked), a step's output becomes a TokenChunk, a finished request a
// GenerateResult. Requests: client_requests.cpp; chunks and results: client_results.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/sched/step_plan.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "engine/util/error_code.hpp"
#include "engine/util/expected.hpp"
#include "schema/client.capnp.h"

namespace troupe::wire {

struct frame_limits;
// The bounds of a client message of at most max_bytes (read flat: every word at most
// twice, nesting 8).
frame_limits client_frame_limits(size_t max_bytes);

struct request_limits {
  int32_t context = 0;            // prompt + output tokens at most
  int32_t max_prompt_bytes = 1 << 20;
  int32_t max_stop_strings = 16;
};

// A request's sampler settings, and back, checked (token ids against a vocabulary of
// `vocab`; values within the bounds the HTTP API takes: temperature 0 to 2, ...).
void write_sampling(schema::Sampling::Builder s, const sampling_params& p);
expected<sampling_params> read_sampling(schema::Sampling::Reader s, int32_t vocab);

expected<request_params> decode_generate_request(std::span<const uint8_t> bytes, const tokenizer& tok,
                                                 const request_limits& lim);
// What the router reads of a request (kv-aware routing, SLO figures): its prompt's token ids, as the
// scheduler will see them (text tokenized with BOS; ids out of the vocabulary dropped:
// the scheduler refuses the request anyway), its prefix-cache namespace and its class.
struct route_view {
  std::vector<int32_t> prompt;
  uint64_t cache_namespace = 0;
  std::string slo_class;
  std::vector<int32_t> delivered;  // output a client was given by another gateway
};
// An SLO class's name is this long at most.
inline constexpr size_t max_class_name = 64;
// (A null tokenizer leaves text prompts' ids out.)
expected<route_view> peek_route(std::span<const uint8_t> bytes, const tokenizer* tok, const request_limits& lim);

std::vector<uint8_t> encode_generate_request_text(const std::string& prompt, const request_params& p);
// A request whose prompt is p.prompt's token ids, as they are (no BOS added).
std::vector<uint8_t> encode_generate_request_tokens(const request_params& p);
// Fills a request under construction (an RPC call's parameters, say).
void fill_generate_request(schema::GenerateRequest::Builder r, const std::string& prompt, const request_params& p,
                           bool steps_include_prompt);

std::vector<uint8_t> encode_token_chunk(uint64_t request, uint32_t seq, const step_output& out);
// A failed request's result carries why and what kind of failure (schema/client.capnp's
// ErrorKind: the request itself, no replica able to serve it in time, or the server's own
// fault; the other error codes travel as internal).
std::vector<uint8_t> encode_generate_result(uint64_t request, const step_output& last, uint32_t chunks,
                                            const std::string& error_text = "", error_code kind = error_code::invalid);
// A finished request's end as one message: its final output (tokens and text, if any)
// rides inside the result as chunk `seq`, so the end cannot be half-delivered.
std::vector<uint8_t> encode_final_result(uint64_t request, uint32_t seq, const step_output& out);

struct chunk_view {
  uint64_t request = 0;
  uint32_t seq = 0;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<sample_result> logprobs;  // per token, when the request asked for them
};
expected<chunk_view> decode_token_chunk(std::span<const uint8_t> bytes);
// Only what relaying a chunk needs (request, seq, token ids): no text, no log-probabilities.
expected<chunk_view> peek_token_chunk(std::span<const uint8_t> bytes);

struct result_view {
  uint64_t request = 0;
  finish_reason reason = finish_reason::none;
  uint32_t prompt_tokens = 0, output_tokens = 0, chunks = 0, cached_prompt_tokens = 0;
  std::string error;
  error_code error_type = error_code::invalid;  // when error is set: invalid, unavailable or internal
  std::optional<chunk_view> last;  // the final chunk, inside a scheduler's result
  bool handed_off = false;         // a prefill replica's end of a request that goes on
  uint32_t kv_sent = 0;            // with handed_off: prompt tokens whose KV it sent
};
expected<result_view> decode_generate_result(std::span<const uint8_t> bytes);
// The same, from a result already parsed.
expected<result_view> read_generate_result(schema::GenerateResult::Reader r);

// The router's rewrites. A request frame with the output already delivered and the
// disaggregation fields set (kvTo, kvFrom; empty or 0 clears them); a chunk renumbered for
// the client (request id and seq); a scheduler's final result split into its final chunk
// (seq, if any) and the result proper (chunks counted to match).
struct route_rewrite {
  std::span<const int32_t> delivered;
  std::string kv_to;      // prefill only, for this decode replica
  uint32_t kv_from = 0;   // prompt tokens whose KV a prefill replica sent
};
expected<std::vector<uint8_t>> with_route(std::span<const uint8_t> request, const route_rewrite& w);
expected<std::vector<uint8_t>> renumber_chunk(std::span<const uint8_t> chunk, uint64_t request, uint32_t seq);
struct split_result {
  std::optional<std::vector<uint8_t>> last;  // a TokenChunk frame
  std::vector<int32_t> last_tokens;
  std::vector<uint8_t> result;               // a GenerateResult frame
};
expected<split_result> split_final_result(std::span<const uint8_t> result, uint64_t request, uint32_t seq);

}  // namespace troupe::wire
