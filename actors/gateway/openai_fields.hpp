// What the OpenAI-compatible routes read alike (openai.hpp): the body as a JSON object,
// the model, a chat's messages, prompt bounds, token ids; each refusal an api_error
// naming its field. Internal to the gateway's OpenAI files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/gateway/openai.hpp"

namespace troupe::openai::fields {

api_error bad(const std::string& message, const std::string& param, int status = 400, const std::string& code = "");

// The body as a JSON object, or why it is not one.
std::variant<nlohmann::json, api_error> body_object(const std::string& body);

api_error unknown_model(const std::string& asked, const std::string& model_id);
// An optional "model": absent, or the one served.
std::optional<api_error> optional_model(const nlohmann::json& j, const std::string& model_id);

// Chat templates here always end with the assistant's cue: a request that asks otherwise
// (vLLM's add_generation_prompt: false, to continue a turn) is refused, not misread.
std::optional<api_error> generation_prompt_only(const nlohmann::json& j);

// A prompt's text past the server's limit (413), or past what the context can hold (400,
// as OpenAI's context_length_exceeded): found from its bytes, before it is tokenized.
std::optional<api_error> prompt_too_long(const std::string& text, const api_limits& lim, const std::string& which,
                                         const std::string& param);

// Appends the token ids of the JSON array `a` to `out`; false when one is not an integer of
// 0 or more (in int32).
bool append_token_ids(const nlohmann::json& a, std::vector<int32_t>& out);

// A chat request's messages into its one prompt, through the template. A message's content is a
// string, or an array of parts of which this server takes text parts (joined in order);
// "developer" is the newer name of the system role.
std::optional<api_error> read_messages(const nlohmann::json& j, chat_template tmpl, api_request& r);

}  // namespace troupe::openai::fields
