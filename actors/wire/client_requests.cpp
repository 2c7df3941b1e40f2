// The client API's requests (client_codec.hpp): sampler settings, GenerateRequest frames
// written and read (prompts tokenized, every field checked), and the router's look at a
// request's route.
#include "actors/wire/client_codec.hpp"

#include <capnp/message.h>
#include <kj/exception.h>

#include "actors/wire/frame.hpp"
#include "schema/client.capnp.h"

namespace troupe::wire {

void write_sampling(schema::Sampling::Builder s, const sampling_params& p) {
  s.setTemperature(p.temperature);
  s.setTopK(p.top_k);
  s.setTopP(p.top_p);
  s.setMinP(p.min_p);
  s.setRepetitionPenalty(p.repetition_penalty);
  s.setFrequencyPenalty(p.frequency_penalty);
  s.setPresencePenalty(p.presence_penalty);
  s.setSeed(p.seed);
  s.setLogprobs(p.logprobs);
  auto biases = s.initLogitBias(static_cast<unsigned>(p.logit_bias.size()));
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    biases[static_cast<unsigned>(i)].setToken(p.logit_bias[i].token);
    biases[static_cast<unsigned>(i)].setBias(p.logit_bias[i].bias);
  }
}

expected<sampling_params> read_sampling(schema::Sampling::Reader s, int32_t vocab) {
  sampling_params p;
  p.temperature = s.getTemperature();
  p.top_k = s.getTopK();
  p.top_p = s.getTopP();
  p.min_p = s.getMinP();
  p.repetition_penalty = s.getRepetitionPenalty();
  p.frequency_penalty = s.getFrequencyPenalty();
  p.presence_penalty = s.getPresencePenalty();
  p.seed = s.getSeed();
  p.logprobs = s.getLogprobs();
  const auto biases = s.getLogitBias();
  if (biases.size() > max_logit_bias) return error{"logit bias: more than " + std::to_string(max_logit_bias) + " entries"};
  for (auto b : biases) {  // (their values: validate() below)
    if (b.getToken() < 0 || b.getToken() >= vocab)
      return error{"logit bias: token " + std::to_string(b.getToken()) + " is outside the vocabulary"};
    p.logit_bias.push_back({b.getToken(), b.getBias()});
  }
  if (auto e = validate(p)) return error{*e};
  // The bounds the HTTP API takes too (OpenAI's, and vLLM's for repetition_penalty): the
  // sampler itself would take more, which troupe-run allows.
  if (p.temperature > 2.0f) return error{"temperature must be in [0, 2]"};
  if (p.repetition_penalty < 0.01f || p.repetition_penalty > 10.0f) return error{"repetition_penalty must be in [0.01, 10]"};
  if (p.top_k > (1 << 30)) return error{"top_k must be in 0..1073741824"};
  return p;
}

frame_limits client_frame_limits(size_t max_bytes) {
  frame_limits fl = frame_limits::flat(max_bytes);
  fl.traversal_words += 64;
  return fl;
}

namespace {

// A request's prompt as token ids: text tokenized with BOS first, or ids as they are (an
// id outside the vocabulary is an error, or, with `drop_unknown`, left out).
expected<std::vector<int32_t>> read_prompt(schema::GenerateRequest::Prompt::Reader prompt, const tokenizer& tok,
                                           const request_limits& lim, bool drop_unknown) {
  std::vector<int32_t> ids;
  if (prompt.isText()) {
    const auto text = prompt.getText();
    if (text.size() > static_cast<size_t>(lim.max_prompt_bytes))
      return error{"the prompt's text is " + std::to_string(text.size()) + " bytes, past this server's limit of " +
                   std::to_string(lim.max_prompt_bytes)};
    // Checked before tokenizing: a text this long has more tokens than the context holds.
    if (const size_t most = prompt_text_limit(tok, lim.context, static_cast<size_t>(lim.max_prompt_bytes)); text.size() > most)
      return error{"the prompt's text is " + std::to_string(text.size()) + " bytes, more than the model's context of " +
                   std::to_string(lim.context) + " tokens can hold (at most " + std::to_string(most) + " bytes)"};
    return tok.encode(std::string_view(text.cStr(), text.size()), true);
  }
  for (int32_t t : prompt.getTokens()) {
    if (t >= 0 && t < tok.size())
      ids.push_back(t);
    else if (!drop_unknown)
      return error{"token id " + std::to_string(t) + " is outside the vocabulary"};
  }
  return ids;
}

}  // namespace

expected<request_params> decode_generate_request(std::span<const uint8_t> bytes, const tokenizer& tok,
                                                 const request_limits& lim) {
  auto frame = frame_reader::parse(bytes, client_frame_limits(static_cast<size_t>(lim.max_prompt_bytes) * 2 + 65536));
  if (!frame) return frame.err();
  try {
    auto r = (*frame)->root<schema::GenerateRequest>();
    request_params p;
    auto prompt = read_prompt(r.getPrompt(), tok, lim, false);
    if (!prompt) return prompt.err();
    p.prompt = std::move(prompt).value();
    if (p.prompt.empty()) return error{"the prompt is empty"};
    if (p.prompt.size() >= static_cast<size_t>(lim.context))
      return error{"the prompt is " + std::to_string(p.prompt.size()) + " tokens; the model's context is " +
                   std::to_string(lim.context)};
    if (r.hasSloClass()) {
      const auto c = r.getSloClass();
      if (c.size() > max_class_name) return error{"sloClass is longer than " + std::to_string(max_class_name) + " bytes"};
      p.slo_class.assign(c.cStr(), c.size());
    }
    if (r.hasKvEviction()) {
      const auto e = r.getKvEviction();
      const auto policy = static_cast<uint16_t>(e.getPolicy());
      if (policy > static_cast<uint16_t>(kv_policy::scissorhands))
        return error{"kvEviction: policy " + std::to_string(policy) + " is none, streaming, h2o or scissorhands"};
      kv_eviction_config c{static_cast<kv_policy>(policy), e.getBudget(), e.getSinks(), e.getWindow(), e.getHistory()};
      if (auto bad = validate(c, true)) return error{"kvEviction: " + *bad};
      if (c.enabled() && c.budget > lim.context)
        return error{"kvEviction: a budget of " + std::to_string(c.budget) + " tokens is past the model's context of " +
                     std::to_string(lim.context)};
      p.eviction = c;
    }
    // Streaming eviction may run past the context: its positions stay within the budget.
    const int32_t most_tokens = p.eviction && p.eviction->rope_in_cache() ? max_tokens_past_context : lim.context;
    p.max_tokens = r.getMaxTokens();
    if (r.getStepsIncludePrompt()) {
      const int32_t after_bos = static_cast<int32_t>(p.prompt.size()) - tok.leading_bos(p.prompt);
      if (p.max_tokens <= after_bos)
        return error{"the prompt is " + std::to_string(after_bos) + " tokens; " + std::to_string(p.max_tokens) +
                     " steps leave no room to generate"};
      p.max_tokens -= after_bos;
    }
    if (p.max_tokens < 1 || p.max_tokens > most_tokens)
      return error{"maxTokens (" + std::to_string(p.max_tokens) + ") must be in 1.." + std::to_string(most_tokens) +
                   (most_tokens == lim.context ? " (the model's context)" : "")};
    auto sampling = read_sampling(r.getSampling(), tok.size());
    if (!sampling) return sampling.err();
    p.sampling = std::move(sampling).value();
    const auto stops = r.getStopStrings();
    if (stops.size() > static_cast<unsigned>(lim.max_stop_strings)) return error{"too many stop strings"};
    for (auto st : stops) p.stop_strings.emplace_back(st.cStr(), st.size());
    for (int32_t t : r.getStopTokens()) {
      if (t < 0 || t >= tok.size()) return error{"stop token " + std::to_string(t) + " is outside the vocabulary"};
      p.stop_tokens.push_back(t);
    }
    p.priority = r.getPriority();
    p.ignore_eos = r.getIgnoreEos();
    if (r.getSpeculative() < -1 || r.getSpeculative() > max_draft_tokens)
      return error{"speculative must be -1 (the server's setting), 0 (none) or a draft cap of 1.." +
                   std::to_string(max_draft_tokens) + "; got " + std::to_string(r.getSpeculative())};
    p.speculative = r.getSpeculative();
    p.cache_namespace = r.getCacheNamespace();
    const auto delivered = r.getDelivered();
    if (delivered.size() >= static_cast<unsigned>(lim.context)) return error{"more delivered tokens than the context"};
    for (int32_t t : delivered) {
      if (t < 0 || t >= tok.size()) return error{"delivered token id " + std::to_string(t) + " is outside the vocabulary"};
      p.delivered.push_back(t);
    }
    if (r.hasKvTo()) {
      const auto to = r.getKvTo();
      if (to.size() > max_class_name) return error{"kvTo is longer than " + std::to_string(max_class_name) + " bytes"};
      p.kv_to.assign(to.cStr(), to.size());
    }
    if (r.getKvFrom() > p.prompt.size())
      return error{"kvFrom is " + std::to_string(r.getKvFrom()) + "; the prompt is " + std::to_string(p.prompt.size()) +
                   " tokens"};
    p.kv_from = static_cast<int32_t>(r.getKvFrom());
    return p;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed request: ") + e.getDescription().cStr()};
  }
}

std::vector<uint8_t> encode_generate_request_text(const std::string& prompt, const request_params& p) {
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::GenerateRequest>();
  fill_generate_request(r, prompt, p, false);
  return to_bytes(msg);
}

namespace {

// Everything of a request but its prompt.
void fill_request_params(schema::GenerateRequest::Builder r, const request_params& p, bool steps_include_prompt) {
  r.setMaxTokens(p.max_tokens);
  write_sampling(r.initSampling(), p.sampling);
  auto stops = r.initStopStrings(static_cast<unsigned>(p.stop_strings.size()));
  for (size_t i = 0; i < p.stop_strings.size(); ++i) stops.set(static_cast<unsigned>(i), p.stop_strings[i]);
  auto st = r.initStopTokens(static_cast<unsigned>(p.stop_tokens.size()));
  for (size_t i = 0; i < p.stop_tokens.size(); ++i) st.set(static_cast<unsigned>(i), p.stop_tokens[i]);
  r.setPriority(p.priority);
  r.setIgnoreEos(p.ignore_eos);
  r.setSpeculative(p.speculative);
  r.setCacheNamespace(p.cache_namespace);
  r.setStepsIncludePrompt(steps_include_prompt);
  if (!p.slo_class.empty()) r.setSloClass(p.slo_class);
  if (p.eviction) {
    auto e = r.initKvEviction();
    e.setPolicy(static_cast<schema::KvPolicy>(p.eviction->policy));
    e.setBudget(p.eviction->budget);
    e.setSinks(p.eviction->sinks);
    e.setWindow(p.eviction->window);
    e.setHistory(p.eviction->history);
  }
}

}  // namespace

void fill_generate_request(schema::GenerateRequest::Builder r, const std::string& prompt, const request_params& p,
                           bool steps_include_prompt) {
  r.initPrompt().setText(prompt);
  fill_request_params(r, p, steps_include_prompt);
}

std::vector<uint8_t> encode_generate_request_tokens(const request_params& p) {
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::GenerateRequest>();
  auto ids = r.initPrompt().initTokens(static_cast<unsigned>(p.prompt.size()));
  for (size_t i = 0; i < p.prompt.size(); ++i) ids.set(static_cast<unsigned>(i), p.prompt[i]);
  fill_request_params(r, p, false);
  return to_bytes(msg);
}

expected<route_view> peek_route(std::span<const uint8_t> bytes, const tokenizer* tok, const request_limits& lim) {
  auto frame = frame_reader::parse(bytes, client_frame_limits(static_cast<size_t>(lim.max_prompt_bytes) * 2 + 65536));
  if (!frame) return frame.err();
  try {
    auto r = (*frame)->root<schema::GenerateRequest>();
    route_view v;
    v.cache_namespace = r.getCacheNamespace();
    if (r.hasSloClass() && r.getSloClass().size() <= max_class_name) v.slo_class = r.getSloClass().cStr();
    // (Their ids are checked where the request is read whole, by its scheduler.)
    if (r.hasDelivered() && r.getDelivered().size() < static_cast<unsigned>(std::max(lim.context, 1)))
      for (int32_t t : r.getDelivered()) v.delivered.push_back(t);
    auto prompt = r.getPrompt();
    if (!tok) return v;
    auto ids = read_prompt(prompt, *tok, lim, true);
    if (!ids) return ids.err();
    v.prompt = std::move(ids).value();
    return v;
  } catch (const kj::Exception& e) {
    return error{std::string("a malformed request: ") + e.getDescription().cStr()};
  }
}

expected<std::vector<uint8_t>> with_route(std::span<const uint8_t> request, const route_rewrite& w) {
  auto frame = frame_reader::parse(request, client_frame_limits(size_t{1} << 24));
  if (!frame) return frame.err();
  try {
    capnp::MallocMessageBuilder msg;
    msg.setRoot((*frame)->root<schema::GenerateRequest>());
    auto r = msg.getRoot<schema::GenerateRequest>();
    auto d = r.initDelivered(static_cast<unsigned>(w.delivered.size()));
    for (size_t i = 0; i < w.delivered.size(); ++i) d.set(static_cast<unsigned>(i), w.delivered[i]);
    if (w.kv_to.empty())
      r.disownKvTo();
    else
      r.setKvTo(w.kv_to);
    r.setKvFrom(w.kv_from);
    return to_bytes(msg);
  } catch (const kj::Exception& e) {
    return error{std::string("malformed request: ") + e.getDescription().cStr()};
  }
}

}  // namespace troupe::wire
