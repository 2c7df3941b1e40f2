// The OpenAI-compatible API's requests, read and checked field by field (the chat
// templates: openai_templates.cpp; the answers: openai_bodies.cpp).
#include "actors/gateway/openai.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace troupe::openai {

namespace {

using nlohmann::json;

api_error bad(const std::string& message, const std::string& param, int status = 400, const std::string& code = "") {
  api_error e;
  e.status = status;
  e.message = message;
  e.param = param;
  e.code = code;
  return e;
}

// Chat templates here always end with the assistant's cue: a request that asks otherwise
// (vLLM's add_generation_prompt: false, to continue a turn) is refused, not misread.
std::optional<api_error> generation_prompt_only(const json& j) {
  if (j.contains("add_generation_prompt") && !j["add_generation_prompt"].is_null() &&
      !(j["add_generation_prompt"].is_boolean() && j["add_generation_prompt"].get<bool>()))
    return bad("'add_generation_prompt' other than true is not supported by this server", "add_generation_prompt");
  return std::nullopt;
}

// A prompt's text past the server's limit (413), or past what the context can hold (400,
// as OpenAI's context_length_exceeded): found from its bytes, before it is tokenized.
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

}  // namespace

namespace {

// Appends the token ids of the JSON array `a` to `out`; false when one is not an integer of
// 0 or more (in int32).
bool append_token_ids(const json& a, std::vector<int32_t>& out) {
  for (const auto& t : a) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) return false;
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return true;
}

// A chat request's messages into its one prompt, through the template. A message's content is a
// string, or an array of parts of which this server takes text parts (joined in order);
// "developer" is the newer name of the system role.
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

// A completion request's prompts, in OpenAI's four shapes: a string, an array of strings,
// an array of token ids, or an array of such arrays. Token ids are taken as given (no BOS
// added).
std::optional<api_error> read_prompts(const json& j, const api_limits& lim, api_request& r) {
  if (!j.contains("prompt")) return bad("'prompt' is required", "prompt");
  const auto& p = j["prompt"];
  const std::string shapes = "'prompt' must be a string, an array of strings, an array of token ids, or an array of such arrays";
  auto ids_of = [&](const json& a) -> std::optional<api_error> {
    if (a.empty()) return bad("'prompt' holds no token ids", "prompt");
    if (a.size() >= static_cast<size_t>(std::max(lim.context, 1)))
      return bad("the prompt has " + std::to_string(a.size()) + " tokens; the model's context is " +
                     std::to_string(lim.context),
                 "prompt");
    prompt_input in;
    in.is_tokens = true;
    if (!append_token_ids(a, in.tokens)) return bad("'prompt' token ids must be integers of 0 or more", "prompt");
    r.prompts.push_back(std::move(in));
    return std::nullopt;
  };
  if (p.is_string()) {
    r.prompts.push_back({p.get<std::string>(), {}, false});
    return std::nullopt;
  }
  if (!p.is_array() || p.empty()) return bad(p.is_array() ? "'prompt' is an empty array" : shapes, "prompt");
  if (p[0].is_number()) return ids_of(p);
  if (p.size() > static_cast<size_t>(lim.max_choices))
    return bad("'prompt' has " + std::to_string(p.size()) + " prompts; this server takes at most " +
                   std::to_string(lim.max_choices) + " in one request",
               "prompt");
  for (const auto& one : p) {
    if (one.is_string() && p[0].is_string()) {
      r.prompts.push_back({one.get<std::string>(), {}, false});
    } else if (one.is_array() && p[0].is_array()) {
      if (auto e = ids_of(one)) return e;
    } else {
      const bool mixed = (p[0].is_string() || p[0].is_array()) && (one.is_string() || one.is_array());
      return bad(mixed ? "'prompt' must not mix texts and token-id arrays" : shapes, "prompt");
    }
  }
  return std::nullopt;
}

// Fields that would change the answer in ways this server does not implement are refused
// rather than ignored; their neutral values (what clients often send by default) pass.
std::optional<api_error> refuse_unsupported(const json& j) {
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  auto unsupported = [&](const char* key, const std::string& what) {
    return bad(std::string("'") + key + "' " + what + " is not supported by this server", key);
  };
  if (present("echo") && !(j["echo"].is_boolean() && !j["echo"].get<bool>())) return unsupported("echo", "other than false");
  if (present("best_of") && !(j["best_of"].is_number_integer() && j["best_of"].get<int64_t>() == 1))
    return unsupported("best_of", "other than 1");
  if (present("suffix") && !(j["suffix"].is_string() && j["suffix"].get<std::string>().empty()))
    return unsupported("suffix", "(insertion)");
  for (const char* key : {"tools", "functions"})
    if (present(key) && !(j[key].is_array() && j[key].empty())) return unsupported(key, "(tool calls)");
  if (present("response_format") &&
      !(j["response_format"].is_object() && j["response_format"].value("type", std::string()) == "text"))
    return unsupported("response_format", "other than {\"type\": \"text\"}");
  return std::nullopt;
}

// The body as a JSON object, or why it is not one.
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

// troupe's extension: "kv_eviction": {"policy": "h2o", "budget": 512, "sinks": 4,
// "window": 128, "history": 16}, this request's own KV eviction (engine/kv/kv_eviction.hpp;
// {"policy": "none"}: the whole cache, whatever the server's default).
std::optional<api_error> read_kv_eviction(const json& j, const api_limits& lim, api_request& r) {
  if (!j.contains("kv_eviction") || j["kv_eviction"].is_null()) return std::nullopt;
  const json& e = j["kv_eviction"];
  const char* field = "kv_eviction";
  if (!e.is_object()) return bad("'kv_eviction' must be an object: {\"policy\": ..., \"budget\": ...}", field);
  kv_eviction_config c;
  for (const auto& [key, value] : e.items()) {
    if (key == "policy") {
      const auto p = value.is_string() ? parse_kv_policy(value.get<std::string>()) : std::nullopt;
      if (!p) return bad("'kv_eviction.policy' must be \"none\", \"streaming\", \"h2o\" or \"scissorhands\"", field);
      c.policy = *p;
      continue;
    }
    int32_t* slot = key == "budget" ? &c.budget : key == "sinks" ? &c.sinks : key == "window" ? &c.window
                  : key == "history" ? &c.history : nullptr;
    if (!slot) return bad("'kv_eviction' takes policy, budget, sinks, window and history; not '" + key.substr(0, 40) + "'", field);
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX)
      return bad("'kv_eviction." + key + "' must be an integer of 0 or more", field);
    *slot = static_cast<int32_t>(value.get<int64_t>());
  }
  if (!e.contains("policy")) return bad("'kv_eviction' needs a 'policy'", field);
  if (auto problem = validate(c, true)) return bad("'kv_eviction': " + *problem, field);
  if (c.enabled() && c.budget > lim.context)
    return bad("'kv_eviction': a budget of " + std::to_string(c.budget) + " tokens is past the model's context of " +
                   std::to_string(lim.context),
               field);
  r.params.eviction = c;
  return std::nullopt;
}

}  // namespace

std::variant<api_request, api_error> parse_request(const std::string& body, bool chat, const std::string& model_id,
                                                   chat_template tmpl, const api_limits& lim) {
  auto parsed = body_object(body);
  if (auto* e = std::get_if<api_error>(&parsed)) return *e;
  json j = std::move(std::get<json>(parsed));
  api_request r;
  r.chat = chat;
  if (!j.contains("model") || !j["model"].is_string()) return bad("'model' must be a string", "model");
  r.model = j["model"].get<std::string>();
  if (r.model != model_id) return unknown_model(r.model, model_id);

  if (chat) {
    if (auto e = read_messages(j, tmpl, r)) return *e;
    if (auto e = generation_prompt_only(j)) return *e;
  } else {
    if (auto e = read_prompts(j, lim, r)) return *e;
  }
  // (Text is UTF-8: the JSON parser refuses anything else.) Checked before anything
  // tokenizes it.
  for (size_t k = 0; k < r.prompts.size(); ++k)
    if (auto e = prompt_too_long(r.prompts[k].text, lim, r.prompts.size() == 1 ? "the prompt" : "prompt " + std::to_string(k),
                                 chat ? "messages" : "prompt"))
      return *e;

  auto number = [&](const char* key, double lo, double hi, double& out) -> std::optional<api_error> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    if (!j[key].is_number()) return bad(std::string("'") + key + "' must be a number", key);
    const double v = j[key].get<double>();
    // The bounds as a person writes them: 0, 2, 0.01.
    auto shortest = [](double x) {
      char text[32];
      std::snprintf(text, sizeof(text), "%g", x);
      return std::string(text);
    };
    if (!(v >= lo && v <= hi))
      return bad(std::string("'") + key + "' must be in [" + shortest(lo) + ", " + shortest(hi) + "]", key);
    out = v;
    return std::nullopt;
  };
  auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t& out) -> std::optional<api_error> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    // A whole number written as a float (5.0, as Python's json writes a float) counts.
    const bool whole = j[key].is_number_float() && std::floor(j[key].get<double>()) == j[key].get<double>() &&
                       std::fabs(j[key].get<double>()) < 9.0e15;
    if (!j[key].is_number_integer() && !whole) return bad(std::string("'") + key + "' must be an integer", key);
    const int64_t v = whole ? static_cast<int64_t>(j[key].get<double>()) : j[key].get<int64_t>();
    if (v < lo || v > hi)
      return bad(std::string("'") + key + "' must be in " + std::to_string(lo) + ".." + std::to_string(hi), key);
    out = v;
    return std::nullopt;
  };
  if (auto e = refuse_unsupported(j)) return *e;
  double temperature = 1.0, top_p = 1.0, freq = 0.0, pres = 0.0, min_p = 0.0, repetition = 1.0;
  int64_t max_tokens = 16, seed = 0, n = 1, top_k = 0;
  if (chat) max_tokens = std::min<int64_t>(lim.max_tokens, lim.context);
  if (auto e = number("temperature", 0.0, 2.0, temperature)) return *e;
  if (auto e = number("top_p", 0.0, 1.0, top_p)) return *e;
  if (top_p == 0.0) return bad("'top_p' must be above 0", "top_p");
  if (auto e = number("frequency_penalty", -2.0, 2.0, freq)) return *e;
  if (auto e = number("presence_penalty", -2.0, 2.0, pres)) return *e;
  // Sampling extensions other servers of this ecosystem take (vLLM, llama.cpp): top_k
  // (0 or -1: off), min_p, repetition_penalty.
  if (auto e = integer("top_k", -1, int64_t{1} << 30, top_k)) return *e;
  if (auto e = number("min_p", 0.0, 1.0, min_p)) return *e;
  if (auto e = number("repetition_penalty", 0.01, 10.0, repetition)) return *e;
  if (auto e = read_kv_eviction(j, lim, r)) return *e;
  // troupe's extension: "slo_class": "interactive", a [[class]] of the topology (the
  // scheduler says whether it exists; the X-Troupe-Class header says the same).
  if (j.contains("slo_class") && !j["slo_class"].is_null()) {
    const json& c = j["slo_class"];
    if (!c.is_string() || c.get_ref<const std::string&>().empty() || c.get_ref<const std::string&>().size() > 64)
      return bad("'slo_class' must be a class's name (a string of 1 to 64 bytes)", "slo_class");
    r.params.slo_class = c.get<std::string>();
  }
  // (Streaming eviction lets a request run past the context.)
  const int64_t most_tokens = r.params.eviction && r.params.eviction->rope_in_cache()
                                  ? int64_t{max_tokens_past_context}
                                  : std::min<int64_t>(lim.max_tokens, lim.context);
  if (auto e = integer(chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens", 1,
                       most_tokens, max_tokens))
    return *e;
  if (auto e = integer("seed", INT64_MIN, INT64_MAX, seed)) return *e;
  if (auto e = integer("n", 1, lim.max_n, n)) return *e;
  r.n = static_cast<int32_t>(n);
  if (static_cast<int64_t>(r.prompts.size()) * n > lim.max_choices)
    return bad(std::to_string(r.prompts.size()) + " prompts with 'n' " + std::to_string(n) + " ask for " +
                   std::to_string(static_cast<int64_t>(r.prompts.size()) * n) + " completions; this server takes at most " +
                   std::to_string(lim.max_choices) + " in one request",
               "n");
  // Log-probabilities: an integer (how many alternatives) for completions; a boolean plus
  // top_logprobs for chat.
  if (chat) {
    if (j.contains("logprobs") && !j["logprobs"].is_null()) {
      if (!j["logprobs"].is_boolean()) return bad("'logprobs' must be a boolean", "logprobs");
      r.logprobs = j["logprobs"].get<bool>();
    }
    int64_t top = 0;
    if (auto e = integer("top_logprobs", 0, 20, top)) return *e;
    if (top > 0 && !r.logprobs) return bad("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    if (r.logprobs) r.params.sampling.logprobs = static_cast<int32_t>(top);
  } else {
    int64_t lp = -1;
    if (auto e = integer("logprobs", 0, 5, lp)) return *e;
    if (lp >= 0) {
      r.logprobs = true;
      r.params.sampling.logprobs = static_cast<int32_t>(lp);
    }
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return bad("'stream' must be a boolean", "stream");
    r.stream = j["stream"].get<bool>();
  }
  if (j.contains("stream_options") && j["stream_options"].is_object() && j["stream_options"].contains("include_usage")) {
    if (!j["stream_options"]["include_usage"].is_boolean()) return bad("'include_usage' must be a boolean", "stream_options");
    r.include_usage = j["stream_options"]["include_usage"].get<bool>();
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const auto& s = j["stop"];
    if (s.is_string()) {
      r.params.stop_strings.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const auto& x : s) {
        if (!x.is_string()) return bad("'stop' must be a string or an array of up to 4 strings", "stop");
        r.params.stop_strings.push_back(x.get<std::string>());
      }
    } else {
      return bad("'stop' must be a string or an array of up to 4 strings", "stop");
    }
  }
  // vLLM's extensions for benchmarks and token-level stops: ignore_eos (run to max_tokens)
  // and stop_token_ids (besides EOS; checked against the vocabulary by the router).
  if (j.contains("ignore_eos") && !j["ignore_eos"].is_null()) {
    if (!j["ignore_eos"].is_boolean()) return bad("'ignore_eos' must be a boolean", "ignore_eos");
    r.params.ignore_eos = j["ignore_eos"].get<bool>();
  }
  // troupe's extension: speculative, the most drafted tokens per step for this request
  // (0 or false: none; true or absent: as the server is set).
  if (j.contains("speculative") && !j["speculative"].is_null()) {
    int64_t cap = -1;
    if (j["speculative"].is_boolean()) {
      cap = j["speculative"].get<bool>() ? -1 : 0;
    } else if (auto e = integer("speculative", 0, max_draft_tokens, cap)) {
      return bad("'speculative' must be a boolean or a draft cap in 0.." + std::to_string(max_draft_tokens), "speculative");
    }
    r.params.speculative = static_cast<int32_t>(cap);
  }
  // logit_bias: {"TOKEN_ID": BIAS, ...}, each bias in [-100, 100] (the ids are checked
  // against the vocabulary by the router).
  if (j.contains("logit_bias") && !j["logit_bias"].is_null()) {
    const auto& lb = j["logit_bias"];
    if (!lb.is_object()) return bad("'logit_bias' must be an object of token ids and biases", "logit_bias");
    if (lb.size() > max_logit_bias)
      return bad("'logit_bias' has " + std::to_string(lb.size()) + " entries; at most " + std::to_string(max_logit_bias),
                 "logit_bias");
    for (const auto& [key, value] : lb.items()) {
      const bool digits = !key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stoll(key) > INT32_MAX)
        return bad("'logit_bias' keys must be token ids (\"50256\"), not '" + key.substr(0, 40) + "'", "logit_bias");
      if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0))
        return bad("'logit_bias' values must be numbers in [-100, 100]", "logit_bias");
      r.params.sampling.logit_bias.push_back({static_cast<int32_t>(std::stoll(key)), value.get<float>()});
    }
  }
  if (j.contains("stop_token_ids") && !j["stop_token_ids"].is_null()) {
    const auto& ids = j["stop_token_ids"];
    if (!ids.is_array() || ids.size() > 64) return bad("'stop_token_ids' must be an array of up to 64 token ids", "stop_token_ids");
    if (!append_token_ids(ids, r.params.stop_tokens))
      return bad("'stop_token_ids' must hold integers of 0 or more", "stop_token_ids");
  }
  r.params.sampling.temperature = static_cast<float>(temperature);
  r.params.sampling.top_p = static_cast<float>(top_p);
  r.params.sampling.frequency_penalty = static_cast<float>(freq);
  r.params.sampling.presence_penalty = static_cast<float>(pres);
  r.params.sampling.top_k = static_cast<int32_t>(std::max<int64_t>(top_k, 0));
  r.params.sampling.min_p = static_cast<float>(min_p);
  r.params.sampling.repetition_penalty = static_cast<float>(repetition);
  r.params.sampling.seed = static_cast<uint64_t>(seed);
  r.params.max_tokens = static_cast<int32_t>(max_tokens);
  return r;
}

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
