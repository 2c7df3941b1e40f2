// What the OpenAI-compatible routes read alike (openai_fields.hpp), and the tokenize
// routes, which read nothing else.
#include "actors/gateway/openai_fields.hpp"

#include <climits>
#include <cstdint>
#include <string_view>

namespace troupe::openai {

namespace fields {

using nlohmann::json;

api_error bad(const std::string& message, const std::string& param, int status, const std::string& code) {
  api_error e;
  e.status = status;
  e.message = message;
  e.param = param;
  e.code = code;
  return e;
}

std::optional<api_error> generation_prompt_only(const json& j) {
  if (j.contains("add_generation_prompt") && !j["add_generation_prompt"].is_null() &&
      !(j["add_generation_prompt"].is_boolean() && j["add_generation_prompt"].get<bool>()))
    return bad("'add_generation_prompt' other than true is not supported by this server", "add_generation_prompt");
  return std::nullopt;
}

std::optional<api_error> prompt_too_long(const std::string& text, const api_limits& lim, const std::string& which,
                                         const std::string& param) {
  if (text.size() > lim.max_prompt_bytes)
    return bad(which + "'s text is " + std::to_string(text.size()) + " bytes, past this server's limit of " +
                   std::to_string(lim.max_prompt_bytes),
               param, 413);
  if (lim.context_prompt_bytes > 0 && text.size() > lim.context_prompt_bytes)
    return bad(which + "'s text is " + std::to_string(text.size()) + " bytes, more than the model's context of " +
                   std::to_string(lim.context) + " tokens can hold (at most " + std::to_string(lim.context_prompt_bytes) +
                   " bytes)",
               param, 400, "context_length_exceeded");
  return std::nullopt;
}

bool append_token_ids(const json& a, std::vector<int32_t>& out) {
  for (const auto& t : a) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) return false;
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return true;
}

std::optional<api_error> read_messages(const json& j, chat_template tmpl, api_request& r) {
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
    return bad("'messages' must be a non-empty array", "messages");
  std::vector<std::pair<std::string, std::string>> msgs;
  for (const auto& m : j["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content"))
      return bad("each message needs a string 'role' and a 'content'", "messages");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant")
      return bad("message role '" + role + "' is not system, developer, user or assistant", "messages");
    const auto& c = m["content"];
    std::string text;
    if (c.is_string()) {
      text = c.get<std::string>();
    } else if (c.is_array()) {
      for (const auto& part : c) {
        if (!part.is_object() || part.value("type", std::string()) != "text" || !part.contains("text") ||
            !part["text"].is_string())
          return bad("message content parts must be text parts ({\"type\": \"text\", \"text\": ...}); this server "
                     "takes no other kind",
                     "messages");
        text += part["text"].get<std::string>();
      }
    } else {
      return bad("a message's 'content' must be a string or an array of text parts", "messages");
    }
    msgs.emplace_back(role, std::move(text));
  }
  r.prompts.push_back({apply_template(tmpl, msgs), {}, false});
  return std::nullopt;
}

std::variant<json, api_error> body_object(const std::string& body) {
  json j;
  std::string field;  // the top-level key being read, to name it when its value cannot be
  const json::parser_callback_t track = [&field](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) field = parsed.get<std::string>();
    return true;
  };
  try {
    j = json::parse(body, track);
  } catch (const json::parse_error& e) {
    // Where, and in which field's value, in troupe's words (the library's message names
    // its own exception and repeats what it last read, which can be the whole body).
    const std::string in = field.substr(0, 40);
    const bool utf8 = std::string_view(e.what()).find("UTF-8") != std::string_view::npos;
    return bad(std::string("the body is not valid JSON: ") + (utf8 ? "text that is not UTF-8" : "a syntax error") +
                   " at byte " + std::to_string(e.byte) + (in.empty() ? "" : ", after the key '" + in + "'"),
               in);
  } catch (const json::out_of_range&) {
    // A number no double holds (1e309): JSON allows it, nothing here can take it.
    if (field.empty()) return bad("the body holds a number out of range", "");
    return bad("'" + field.substr(0, 40) + "' holds a number out of range", field.substr(0, 40));
  }
  if (!j.is_object()) return bad("the body must be a JSON object", "");
  return j;
}

api_error unknown_model(const std::string& asked, const std::string& model_id) {
  return bad("The model '" + asked + "' does not exist; this server serves '" + model_id + "'", "model", 404,
             "model_not_found");
}

// An optional "model": absent, or the one served.
std::optional<api_error> optional_model(const json& j, const std::string& model_id) {
  if (!j.contains("model") || j["model"].is_null()) return std::nullopt;
  if (!j["model"].is_string()) return bad("'model' must be a string", "model");
  if (j["model"].get<std::string>() != model_id) return unknown_model(j["model"].get<std::string>(), model_id);
  return std::nullopt;
}

}  // namespace fields

using nlohmann::json;
using namespace fields;

std::variant<tokenize_request, api_error> parse_tokenize(const std::string& body, const std::string& model_id,
                                                         chat_template tmpl, const api_limits& lim) {
  auto parsed = body_object(body);
  if (auto* e = std::get_if<api_error>(&parsed)) return *e;
  json j = std::move(std::get<json>(parsed));
  if (auto e = optional_model(j, model_id)) return *e;
  tokenize_request t;
  if (j.contains("messages") == j.contains("prompt")) return bad("send either 'prompt' (text) or 'messages'", "prompt");
  if (j.contains("prompt")) {
    if (!j["prompt"].is_string()) return bad("'prompt' must be a string", "prompt");
    t.text = j["prompt"].get<std::string>();
  } else {
    api_request r;
    if (auto e = read_messages(j, tmpl, r)) return *e;
    t.text = r.prompts.at(0).text;
    if (auto e = generation_prompt_only(j)) return *e;
  }
  if (auto e = prompt_too_long(t.text, lim, "the prompt", "prompt")) return *e;
  if (j.contains("add_special_tokens") && !j["add_special_tokens"].is_null()) {
    if (!j["add_special_tokens"].is_boolean()) return bad("'add_special_tokens' must be a boolean", "add_special_tokens");
    t.add_bos = j["add_special_tokens"].get<bool>();
  }
  return t;
}

std::variant<std::vector<int32_t>, api_error> parse_detokenize(const std::string& body, const std::string& model_id,
                                                               int32_t vocab) {
  auto parsed = body_object(body);
  if (auto* e = std::get_if<api_error>(&parsed)) return *e;
  json j = std::move(std::get<json>(parsed));
  if (auto e = optional_model(j, model_id)) return *e;
  if (!j.contains("tokens") || !j["tokens"].is_array()) return bad("'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  if (!append_token_ids(j["tokens"], ids)) return bad("'tokens' must hold integers of 0 or more", "tokens");
  for (int32_t t : ids)
    if (t >= vocab)
      return bad("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(vocab) + " tokens)",
                 "tokens");
  return ids;
}

}  // namespace troupe::openai
