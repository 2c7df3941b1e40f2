// The OpenAI-compatible API's answers as JSON: completions whole and streamed, errors,
// health, models, tokenizing.
#include "actors/gateway/openai.hpp"

#include <nlohmann/json.hpp>

namespace troupe::openai {

namespace {

using nlohmann::json;

// Compact JSON; text that is not UTF-8 (a token's bytes cut inside a character) comes out
// with U+FFFD in its place instead of failing the answer.
std::string serialized(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const char* reason_name(finish_reason r) {
  switch (r) {
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    default: return "stop";
  }
}

// OpenAI's log-probability objects for a run of tokens.
json logprobs_json(bool chat, const std::vector<sample_result>& lps, const token_text& text_of, size_t text_offset) {
  if (chat) {
    json content = json::array();
    for (const auto& lp : lps) {
      json top = json::array();
      for (const auto& t : lp.top) top.push_back({{"token", text_of(t.token)}, {"logprob", t.logprob}});
      content.push_back({{"token", text_of(lp.token)}, {"logprob", lp.logprob}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& lp : lps) {
    const std::string t = text_of(lp.token);
    tokens.push_back(t);
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (const auto& x : lp.top) top[text_of(x.token)] = x.logprob;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += t.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace

std::string error_body(const api_error& e) {
  json j = {{"error", {{"message", e.message}, {"type", e.type}, {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                       {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return serialized(j);
}

std::string health_body(bool ready, uint32_t replicas, uint32_t replicas_ready, const std::string& detail,
                        uint64_t outages, uint64_t last_down_ms) {
  json j = {{"status", ready ? (replicas_ready < replicas ? "degraded" : "ok") : "unavailable"},
            {"replicas", replicas},
            {"replicas_ready", replicas_ready},
            {"outages", outages},
            {"last_down_ms", last_down_ms}};
  if (!detail.empty()) j["detail"] = detail;
  return serialized(j);
}

namespace {

// Token counts as OpenAI reports them; cached_tokens: prompt tokens the prefix cache served.
json usage_json(uint32_t prompt_tokens, uint32_t output_tokens, uint32_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", output_tokens},
          {"total_tokens", prompt_tokens + output_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

}  // namespace

std::string completion_body(const std::string& id, bool chat, const std::string& model, int64_t created,
                            const std::vector<choice_result>& choices, uint32_t prompt_tokens, uint32_t output_tokens,
                            uint32_t cached_tokens, bool logprobs, const token_text& text_of) {
  json cs = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json c = {{"index", i}, {"finish_reason", reason_name(choices[i].reason)},
              {"logprobs", logprobs ? logprobs_json(chat, choices[i].logprobs, text_of, 0) : json(nullptr)}};
    if (chat)
      c["message"] = {{"role", "assistant"}, {"content", choices[i].text}};
    else
      c["text"] = choices[i].text;
    cs.push_back(c);
  }
  json j = {{"id", id},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", cs},
            {"usage", usage_json(prompt_tokens, output_tokens, cached_tokens)}};
  return serialized(j);
}

std::string chunk_body(const std::string& id, bool chat, const std::string& model, int64_t created, int index,
                       const std::string& text, const std::optional<finish_reason>& reason, bool first,
                       const std::vector<sample_result>* logprobs, const token_text& text_of) {
  json c = {{"index", index}, {"finish_reason", reason ? json(reason_name(*reason)) : json(nullptr)},
            {"logprobs", logprobs && !logprobs->empty() ? logprobs_json(chat, *logprobs, text_of, 0) : json(nullptr)}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || !reason) delta["content"] = text;
    c["delta"] = delta;
  } else {
    c["text"] = text;
  }
  json j = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
            {"model", model}, {"choices", json::array({c})}};
  return serialized(j);
}

std::string usage_chunk_body(const std::string& id, bool chat, const std::string& model, int64_t created,
                             uint32_t prompt_tokens, uint32_t output_tokens, uint32_t cached_tokens) {
  json j = {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", json::array()},
            {"usage", usage_json(prompt_tokens, output_tokens, cached_tokens)}};
  return serialized(j);
}

namespace {
json model_object(const std::string& model, int64_t created) {
  return {{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "troupe"}};
}
}  // namespace

std::string models_body(const std::string& model, int64_t created) {
  json j = {{"object", "list"}, {"data", json::array({model_object(model, created)})}};
  return serialized(j);
}

std::string model_body(const std::string& model, int64_t created) {
  return serialized(model_object(model, created));
}

std::string tokenize_body(const std::vector<int32_t>& tokens, int32_t context) {
  return serialized(json{{"count", tokens.size()}, {"max_model_len", context}, {"tokens", tokens}});
}

std::string detokenize_body(const std::string& text) {
  return serialized(json{{"prompt", text}});
}

}  // namespace troupe::openai
