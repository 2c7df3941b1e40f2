// The client API's answers (client_codec.hpp): token chunks and results written, read,
// renumbered and split.
#include "actors/wire/client_codec.hpp"

#include <capnp/message.h>
#include <kj/exception.h>

#include "actors/wire/frame.hpp"
#include "schema/client.capnp.h"

namespace troupe::wire {

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
  auto frame = frame_reader::parse(bytes, client_frame_limits(size_t{1} << 22));
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
expected<chunk_view> peek_token_chunk(std::span<const uint8_t> bytes) { return read_token_chunk(bytes, false); }

expected<result_view> decode_generate_result(std::span<const uint8_t> bytes) {
  auto frame = frame_reader::parse(bytes, client_frame_limits(size_t{1} << 22));
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

expected<std::vector<uint8_t>> renumber_chunk(std::span<const uint8_t> chunk, uint64_t request, uint32_t seq) {
  auto frame = frame_reader::parse(chunk, client_frame_limits(size_t{1} << 22));
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
  auto frame = frame_reader::parse(result, client_frame_limits(size_t{1} << 22));
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
