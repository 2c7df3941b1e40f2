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

namespace {

frame_limits client_limits(size_t max_bytes) {
  frame_limits fl;
  fl.max_bytes = max_bytes;
  fl.traversal_words = max_bytes / 8 * 2 + 64;
  fl.nesting = 8;
  return fl;
}

}  // namespace

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
  auto frame = frame_reader::parse(bytes, client_limits(static_cast<size_t>(lim.max_prompt_bytes) * 2 + 65536));
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

namespace {

schema::FinishReason to_schema(finish_reason r) {
  switch (r) {
    case finish_reason::stop: return schema::FinishReason::STOP;
    case finish_reason::length: return schema::FinishReason::LENGTH;
    case finish_reason::aborted: return schema::FinishReason::ABORTED;
    case finish_reason::none: break;
  }
  return schema::FinishReason::ERROR;
}

schema::ErrorKind to_schema(error_code c) {
  switch (c) {
    case error_code::invalid: return schema::ErrorKind::INVALID;
    case error_code::unavailable: return schema::ErrorKind::UNAVAILABLE;
    default: return schema::ErrorKind::INTERNAL;
  }
}

void fill_token_chunk(schema::TokenChunk::Builder c, uint64_t request, uint32_t seq, const step_output& out) {
  c.setRequestId(request);
  c.setSeq(seq);
  auto toks = c.initTokens(static_cast<unsigned>(out.new_tokens.size()));
  for (size_t i = 0; i < out.new_tokens.size(); ++i) toks.set(static_cast<unsigned>(i), out.new_tokens[i]);
  c.setText(out.text);
  if (!out.logprobs.empty()) {
    auto lp = c.initLogprobs(static_cast<unsigned>(out.logprobs.size()));
    auto top = c.initTopLogprobs(static_cast<unsigned>(out.logprobs.size()));
    for (size_t i = 0; i < out.logprobs.size(); ++i) {
      lp[static_cast<unsigned>(i)].setToken(out.logprobs[i].token);
      lp[static_cast<unsigned>(i)].setLogprob(out.logprobs[i].logprob);
      auto t = top.init(static_cast<unsigned>(i), static_cast<unsigned>(out.logprobs[i].top.size()));
      for (size_t k = 0; k < out.logprobs[i].top.size(); ++k) {
        t[static_cast<unsigned>(k)].setToken(out.logprobs[i].top[k].token);
        t[static_cast<unsigned>(k)].setLogprob(out.logprobs[i].top[k].logprob);
      }
    }
  }
}

}  // namespace

std::vector<uint8_t> encode_token_chunk(uint64_t request, uint32_t seq, const step_output& out) {
  capnp::MallocMessageBuilder msg;
  fill_token_chunk(msg.initRoot<schema::TokenChunk>(), request, seq, out);
  return to_bytes(msg);
}

namespace {

// A result without its final chunk: counts, reason (error when error_text is set).
schema::GenerateResult::Builder fill_result(capnp::MallocMessageBuilder& msg, uint64_t request, const step_output& last,
                                            uint32_t chunks, const std::string& error_text,
                                            error_code kind = error_code::invalid) {
  auto r = msg.initRoot<schema::GenerateResult>();
  r.setRequestId(request);
  r.setReason(error_text.empty() ? to_schema(last.reason) : schema::FinishReason::ERROR);
  r.setPromptTokens(static_cast<uint32_t>(last.num_prompt_tokens));
  r.setOutputTokens(static_cast<uint32_t>(last.num_output_tokens));
  r.setCachedPromptTokens(static_cast<uint32_t>(last.num_cached_prompt_tokens));
  r.setError(error_text);
  if (!error_text.empty()) r.setErrorKind(to_schema(kind));
  r.setChunks(chunks);
  r.setHandedOff(last.handed_off);
  r.setKvSent(static_cast<uint32_t>(std::max(0, last.kv_sent)));
  return r;
}

}  // namespace

std::vector<uint8_t> encode_final_result(uint64_t request, uint32_t seq, const step_output& out) {
  const bool chunk = !out.new_tokens.empty() || !out.text.empty();
  capnp::MallocMessageBuilder msg;
  auto r = fill_result(msg, request, out, seq + (chunk ? 1 : 0), "");
  if (chunk) {
    fill_token_chunk(r.initLast(), request, seq, out);
    r.setHasLast(true);
  }
  return to_bytes(msg);
}

std::vector<uint8_t> encode_generate_result(uint64_t request, const step_output& last, uint32_t chunks,
                                            const std::string& error_text, error_code kind) {
  capnp::MallocMessageBuilder msg;
  fill_result(msg, request, last, chunks, error_text, kind);
  return to_bytes(msg);
}

namespace {

expected<chunk_view> read_token_chunk(std::span<const uint8_t> bytes, bool whole) {
  auto frame = frame_reader::parse(bytes, client_limits(size_t{1} << 22));
  if (!frame) return frame.err();
  try {
    auto c = (*frame)->root<schema::TokenChunk>();
    chunk_view v;
    v.request = c.getRequestId();
    v.seq = c.getSeq();
    for (int32_t t : c.getTokens()) v.tokens.push_back(t);
    if (!whole) return v;
    v.text.assign(c.getText().cStr(), c.getText().size());
    const auto lps = c.getLogprobs();
    const auto tops = c.getTopLogprobs();
    for (unsigned i = 0; i < lps.size(); ++i) {
      sample_result r;
      r.token = lps[i].getToken();
      r.logprob = lps[i].getLogprob();
      if (i < tops.size())
        for (auto t : tops[i]) r.top.push_back({t.getToken(), t.getLogprob()});
      v.logprobs.push_back(std::move(r));
    }
    return v;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed token chunk: ") + e.getDescription().cStr()};
  }
}

}  // namespace

expected<chunk_view> decode_token_chunk(std::span<const uint8_t> bytes) { return read_token_chunk(bytes, true); }
expected<route_view> peek_route(std::span<const uint8_t> bytes, const tokenizer* tok, const request_limits& lim) {
  auto frame = frame_reader::parse(bytes, client_limits(static_cast<size_t>(lim.max_prompt_bytes) * 2 + 65536));
  if (!frame) return frame.err();
  try {
    auto r = (*frame)->root<schema::GenerateRequest>();
    route_view v;
    v.cache_namespace = r.getCacheNamespace();
    if (r.hasSloClass() && r.getSloClass().size() <= max_class_name) v.slo_class = r.getSloClass().cStr();
    v.eviction = r.hasKvEviction() && r.getKvEviction().getPolicy() != schema::KvPolicy::NONE;
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

expected<chunk_view> peek_token_chunk(std::span<const uint8_t> bytes) { return read_token_chunk(bytes, false); }

expected<result_view> decode_generate_result(std::span<const uint8_t> bytes) {
  auto frame = frame_reader::parse(bytes, client_limits(size_t{1} << 22));
  if (!frame) return frame.err();
  return read_generate_result((*frame)->root<schema::GenerateResult>());
}

expected<result_view> read_generate_result(schema::GenerateResult::Reader r) {
  try {
    result_view v;
    v.request = r.getRequestId();
    switch (r.getReason()) {
      case schema::FinishReason::STOP: v.reason = finish_reason::stop; break;
      case schema::FinishReason::LENGTH: v.reason = finish_reason::length; break;
      case schema::FinishReason::ABORTED: v.reason = finish_reason::aborted; break;
      default: v.reason = finish_reason::none; break;
    }
    v.prompt_tokens = r.getPromptTokens();
    v.output_tokens = r.getOutputTokens();
    v.chunks = r.getChunks();
    v.error.assign(r.getError().cStr(), r.getError().size());
    switch (r.getErrorKind()) {
      case schema::ErrorKind::UNAVAILABLE: v.error_type = error_code::unavailable; break;
      case schema::ErrorKind::INTERNAL: v.error_type = error_code::internal; break;
      default: v.error_type = error_code::invalid; break;  // an unknown kind is not worth a retry
    }
    v.cached_prompt_tokens = r.getCachedPromptTokens();
    v.handed_off = r.getHandedOff();
    v.kv_sent = r.getKvSent();
    if (r.getHasLast()) {
      const auto c = r.getLast();
      chunk_view last;
      last.request = c.getRequestId();
      last.seq = c.getSeq();
      for (int32_t t : c.getTokens()) last.tokens.push_back(t);
      last.text.assign(c.getText().cStr(), c.getText().size());
      v.last = std::move(last);
    }
    return v;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed result: ") + e.getDescription().cStr()};
  }
}

expected<std::vector<uint8_t>> with_route(std::span<const uint8_t> request, const route_rewrite& w) {
  auto frame = frame_reader::parse(request, client_limits(size_t{1} << 24));
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

expected<std::vector<uint8_t>> renumber_chunk(std::span<const uint8_t> chunk, uint64_t request, uint32_t seq) {
  auto frame = frame_reader::parse(chunk, client_limits(size_t{1} << 22));
  if (!frame) return frame.err();
  try {
    capnp::MallocMessageBuilder msg;
    msg.setRoot((*frame)->root<schema::TokenChunk>());
    auto c = msg.getRoot<schema::TokenChunk>();
    c.setRequestId(request);
    c.setSeq(seq);
    return to_bytes(msg);
  } catch (const kj::Exception& e) {
    return error{std::string("malformed token chunk: ") + e.getDescription().cStr()};
  }
}

expected<split_result> split_final_result(std::span<const uint8_t> result, uint64_t request, uint32_t seq) {
  auto frame = frame_reader::parse(result, client_limits(size_t{1} << 22));
  if (!frame) return frame.err();
  try {
    const auto in = (*frame)->root<schema::GenerateResult>();
    split_result out;
    if (in.getHasLast()) {
      capnp::MallocMessageBuilder c;
      c.setRoot(in.getLast());
      auto b = c.getRoot<schema::TokenChunk>();
      b.setRequestId(request);
      b.setSeq(seq);
      for (int32_t t : b.getTokens()) out.last_tokens.push_back(t);
      out.last = to_bytes(c);
      ++seq;
    }
    capnp::MallocMessageBuilder r;
    r.setRoot(in);
    auto b = r.getRoot<schema::GenerateResult>();
    b.disownLast();
    b.setHasLast(false);
    b.setRequestId(request);
    b.setChunks(seq);
    out.result = to_bytes(r);
    return out;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed result: ") + e.getDescription().cStr()};
  }
}

}  // namespace troupe::wire
