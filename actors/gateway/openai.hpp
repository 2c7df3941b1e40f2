// openai: the OpenAI-compatible HTTP API's requests and responses, as JSON, mapped to and
// from troupe's request parameters. Parsing checks every field's type and range and
// reports the first problem the way OpenAI's API does ({"error": {message, type, param,
// code}}, with the HTTP status to send). Beside OpenAI's sampling fields it takes the
// extensions vLLM and llama.cpp's server take (top_k, min_p, repetition_penalty,
// ignore_eos, stop_token_ids), and a completion's several prompts in one request (texts or
// token-id arrays), each with its own choices. Fields whose meaning it does not implement
// (echo, best_of, suffix, tools, functions, response_format other than text) are refused
// unless they hold their neutral value, never silently ignored.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <variant>
#include <string>
#include <vector>

#include "engine/sched/request.hpp"
#include "engine/tokenizer/tokenizer.hpp"

namespace troupe::openai {

enum class chat_template : uint8_t { raw, llama2, chatml, llama3 };

struct api_limits {
  int32_t context = 0;            // the model's context
  int32_t max_tokens = 4096;      // a request may ask for at most this many
  int32_t max_n = 8;              // completions per prompt
  int32_t max_choices = 64;       // completions per request: prompts x n
  size_t max_prompt_bytes = 1 << 20;  // each prompt's text
  // Each prompt's text at most, as the context bounds it (prompt_text_limit: more bytes
  // than this are more tokens than the context holds); 0: no such bound.
  size_t context_prompt_bytes = 0;
};

// One prompt: text (BOS is added when it is tokenized), or token ids taken as given.
struct prompt_input {
  std::string text;
  std::vector<int32_t> tokens;
  bool is_tokens = false;
};

struct api_request {
  bool chat = false;
  std::string model;
  // What the model continues: a chat's messages after the template (one), or a
  // completion's prompts (one or more; each gets n choices, prompt k's j-th at index
  // k * n + j).
  std::vector<prompt_input> prompts;
  request_params params;          // shared by every choice; the prompt is each one's own
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool logprobs = false;
};

struct api_error {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;
};

// body: the request's JSON text. model_id: the one model served.
std::variant<api_request, api_error> parse_request(const std::string& body, bool chat, const std::string& model_id,
                                                   chat_template tmpl, const api_limits& lim);

std::string apply_template(chat_template t, const std::vector<std::pair<std::string, std::string>>& messages);
// The token that ends an assistant's turn in template t where it is not EOS (ChatML's
// <|im_end|>), if the vocabulary has it: a chat answer stops there.
std::optional<int32_t> turn_end_token(chat_template t, const tokenizer& tok);
std::optional<chat_template> template_named(const std::string& name);
// The family a model's own template (GGUF tokenizer.chat_template, Jinja) belongs to:
// ChatML, Llama 2, or raw when it is neither (or there is none).
chat_template template_for_model(const std::string& jinja);
const char* template_name(chat_template t);

// POST /tokenize and /detokenize, in vLLM's shapes. /tokenize takes a completion's
// "prompt" (text) or a chat's "messages" (the text the template makes of them, which ends
// where the assistant's answer starts), and add_special_tokens (BOS; default true);
// /detokenize takes "tokens" (ids inside the vocabulary). "model", when given, must be
// the model served.
struct tokenize_request {
  std::string text;
  bool add_bos = true;
};
std::variant<tokenize_request, api_error> parse_tokenize(const std::string& body, const std::string& model_id,
                                                         chat_template tmpl, const api_limits& lim);
std::variant<std::vector<int32_t>, api_error> parse_detokenize(const std::string& body, const std::string& model_id,
                                                               int32_t vocab);
// {"count", "max_model_len", "tokens"}; {"prompt"}.
std::string tokenize_body(const std::vector<int32_t>& tokens, int32_t context);
std::string detokenize_body(const std::string& text);

std::string error_body(const api_error& e);
// GET /health: "ok" (every replica ready), "degraded" (some), "unavailable" (none; 503).
std::string health_body(bool ready, uint32_t replicas, uint32_t replicas_ready, const std::string& detail,
                        uint64_t outages, uint64_t last_down_ms);

struct choice_result {
  std::string text;
  finish_reason reason = finish_reason::none;
  std::vector<int32_t> tokens;
  std::vector<sample_result> logprobs;  // per token, when asked
};

// The text of one token, for log-probability listings.
using token_text = std::function<std::string(int32_t)>;

// usage.prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache served.
std::string completion_body(const std::string& id, bool chat, const std::string& model, int64_t created,
                            const std::vector<choice_result>& choices, uint32_t prompt_tokens, uint32_t output_tokens,
                            uint32_t cached_tokens, bool logprobs, const token_text& text_of);
// One server-sent event's JSON for a streamed delta (chat: {"delta": {"content": ...}}).
std::string chunk_body(const std::string& id, bool chat, const std::string& model, int64_t created, int index,
                       const std::string& text, const std::optional<finish_reason>& reason, bool first,
                       const std::vector<sample_result>* logprobs = nullptr, const token_text& text_of = {});
std::string usage_chunk_body(const std::string& id, bool chat, const std::string& model, int64_t created,
                             uint32_t prompt_tokens, uint32_t output_tokens, uint32_t cached_tokens);
std::string models_body(const std::string& model, int64_t created);
// GET /v1/models/{id}: the one model.
std::string model_body(const std::string& model, int64_t created);

}  // namespace troupe::openai
