// The OpenAI-compatible API's completion and chat requests, read and checked field by
// field (what every route reads alike: openai_fields.cpp; the chat templates:
// openai_templates.cpp; the answers: openai_bodies.cpp).
#include "actors/gateway/openai.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "actors/gateway/openai_fields.hpp"

namespace troupe::openai {

namespace {

using nlohmann::json;
using namespace fields;

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

}  // namespace troupe::openai
