// The client API's requests and results as the gateway reads them: a prompt or an output
// length the model cannot hold is refused with the figures, and a logit bias outside the
// vocabulary or its range in words; an error's kind (the
// request's own fault, no replica in time, the server's fault) survives the router's
// rewriting, and an unknown kind reads as the request's own fault (not worth a retry).
#include "actors/wire/client_codec.hpp"

#include <capnp/message.h>
#include <doctest/doctest.h>

#include "actors/gateway/api_keys.hpp"
#include "actors/wire/frame.hpp"
#include "schema/client.capnp.h"
#include "tests/support/test_support.hpp"

namespace troupe::wire {

namespace {

request_limits with_context(int32_t context) {
  request_limits lim;
  lim.context = context;
  return lim;
}

}  // namespace

TEST_CASE("a request longer than the context is refused with its length and the context's") {
  const tokenizer& tok = test::tok512();
  const request_limits lim = with_context(64);
  request_params p;
  p.max_tokens = 8;
  std::string words;  // more tokens than the context, in fewer bytes than its bound
  for (int i = 0; i < 80; ++i) words += "a ";
  auto text = decode_generate_request(encode_generate_request_text(words, p), tok, lim);
  REQUIRE_FALSE(text.has_value());
  CHECK(text.err().message.find("the prompt is ") == 0);
  CHECK(text.err().message.find("tokens; the model's context is 64") != std::string::npos);
  p.prompt.assign(64, 5);
  auto ids = decode_generate_request(encode_generate_request_tokens(p), tok, lim);
  REQUIRE_FALSE(ids.has_value());
  CHECK(ids.err().message == "the prompt is 64 tokens; the model's context is 64");
  p.prompt.assign(3, 5);
  p.max_tokens = 65;
  auto many = decode_generate_request(encode_generate_request_tokens(p), tok, lim);
  REQUIRE_FALSE(many.has_value());
  CHECK(many.err().message == "maxTokens (65) must be in 1..64 (the model's context)");
  p.max_tokens = 61;
  CHECK(decode_generate_request(encode_generate_request_tokens(p), tok, lim).has_value());
}

TEST_CASE("a text more than the context can hold is refused from its bytes, before it is tokenized") {
  const tokenizer& tok = test::tok512();
  const request_limits lim = with_context(64);
  request_params p;
  p.max_tokens = 8;
  const size_t most = 64 * tok.max_text_bytes_per_token();
  const std::string over(most + 1, 'o');
  auto refused = decode_generate_request(encode_generate_request_text(over, p), tok, lim);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.err().message == "the prompt's text is " + std::to_string(most + 1) +
                                     " bytes, more than the model's context of 64 tokens can hold (at most " +
                                     std::to_string(most) + " bytes)");
  // The router's look at it stops there too.
  CHECK_FALSE(peek_route(encode_generate_request_text(over, p), &tok, lim).has_value());
  // At the bound it is tokenized, and refused by its token count as before.
  auto counted = decode_generate_request(encode_generate_request_text(over.substr(1), p), tok, lim);
  REQUIRE_FALSE(counted.has_value());
  CHECK(counted.err().message.find("tokens; the model's context is 64") != std::string::npos);
}

TEST_CASE("sampling settings take the bounds the HTTP API takes") {
  const tokenizer& tok = test::tok512();
  const request_limits lim = with_context(64);
  request_params p;
  p.max_tokens = 8;
  auto with = [&](auto set) {
    request_params q = p;
    set(q.sampling);
    auto r = decode_generate_request(encode_generate_request_text("Once", q), tok, lim);
    return r ? std::string() : r.err().message;
  };
  CHECK(with([](sampling_params& s) { s.temperature = 2.0f; }) == "");
  CHECK(with([](sampling_params& s) { s.temperature = 2.01f; }) == "temperature must be in [0, 2]");
  CHECK(with([](sampling_params& s) { s.temperature = 100.0f; }) == "temperature must be in [0, 2]");
  CHECK(with([](sampling_params& s) { s.repetition_penalty = 10.0f; }) == "");
  CHECK(with([](sampling_params& s) { s.repetition_penalty = 11.0f; }) == "repetition_penalty must be in [0.01, 10]");
  CHECK(with([](sampling_params& s) { s.repetition_penalty = 0.001f; }) == "repetition_penalty must be in [0.01, 10]");
  CHECK(with([](sampling_params& s) { s.top_k = (1 << 30) + 1; }) == "top_k must be in 0..1073741824");
}

TEST_CASE("a request's prefix-cache namespace travels with it, 0 when unset") {
  const tokenizer& tok = test::tok512();
  const request_limits lim = with_context(64);
  request_params p;
  p.max_tokens = 4;
  p.cache_namespace = 0x1234567890abcdefull;
  auto text = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
  REQUIRE(text.has_value());
  CHECK(text->cache_namespace == 0x1234567890abcdefull);
  p.prompt = {1, 5};
  p.cache_namespace = 0;
  auto ids = decode_generate_request(encode_generate_request_tokens(p), tok, lim);
  REQUIRE(ids.has_value());
  CHECK(ids->cache_namespace == 0);
}

TEST_CASE("a request's SLO class travels with it and the router reads it with the prompt, a name too long refused") {
  const tokenizer& tok = test::tok512();
  const request_limits lim = with_context(64);
  request_params p;
  p.max_tokens = 4;
  p.slo_class = "interactive";
  p.cache_namespace = 9;
  const auto frame = encode_generate_request_text("Once upon", p);
  auto got = decode_generate_request(frame, tok, lim);
  REQUIRE(got.has_value());
  CHECK(got->slo_class == "interactive");
  auto seen = peek_route(frame, &tok, lim);
  REQUIRE(seen.has_value());
  CHECK(seen->slo_class == "interactive");
  CHECK(seen->cache_namespace == 9);
  CHECK(seen->prompt == tok.encode("Once upon", true));
  // Without a tokenizer the router reads no ids (least-loaded routing needs none).
  auto bare = peek_route(frame, nullptr, lim);
  REQUIRE(bare.has_value());
  CHECK(bare->prompt.empty());
  CHECK(bare->slo_class == "interactive");
  // Ids as they are; those outside the vocabulary left out (the scheduler refuses them).
  p.prompt = {1, 5, 9999};
  p.slo_class.clear();
  auto ids = peek_route(encode_generate_request_tokens(p), &tok, lim);
  REQUIRE(ids.has_value());
  CHECK(ids->prompt == std::vector<int32_t>{1, 5});
  CHECK(ids->slo_class.empty());
  p.prompt = {1, 5};
  CHECK(decode_generate_request(encode_generate_request_tokens(p), tok, lim)->slo_class.empty());
  p.slo_class = std::string(max_class_name + 1, 'x');
  auto long_name = decode_generate_request(encode_generate_request_tokens(p), tok, lim);
  REQUIRE_FALSE(long_name.has_value());
  CHECK(long_name.err().message.find("sloClass is longer than 64 bytes") != std::string::npos);
  CHECK_FALSE(peek_route(std::vector<uint8_t>{1, 2, 3}, &tok, lim).has_value());
}

TEST_CASE("a request's speculative cap travels with it, -1 when unset, and a cap out of range is refused") {
  const tokenizer& tok = test::tok512();
  const request_limits lim = with_context(64);
  request_params p;
  p.max_tokens = 4;
  auto unset = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
  REQUIRE(unset.has_value());
  CHECK(unset->speculative == -1);
  // A frame written without the field (an older client) reads as unset too.
  {
    capnp::MallocMessageBuilder msg;
    auto r = msg.initRoot<schema::GenerateRequest>();
    r.initPrompt().setText("Once");
    r.setMaxTokens(4);
    auto old = decode_generate_request(to_bytes(msg), tok, lim);
    REQUIRE(old.has_value());
    CHECK(old->speculative == -1);
  }
  for (int32_t cap : {0, 1, 16}) {
    p.speculative = cap;
    auto got = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
    REQUIRE(got.has_value());
    CHECK(got->speculative == cap);
  }
  for (int32_t cap : {-2, 17}) {
    p.speculative = cap;
    auto bad = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
    REQUIRE_FALSE(bad.has_value());
    CHECK(bad.err().message.find("speculative must be -1") == 0);
  }
}

TEST_CASE("a request's KV eviction travels with it, unset when absent, and a policy that cannot work is refused") {
  const tokenizer& tok = test::tok512();
  const request_limits lim = with_context(64);
  request_params p;
  p.max_tokens = 4;
  auto unset = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
  REQUIRE(unset.has_value());
  CHECK_FALSE(unset->eviction.has_value());
  for (const kv_eviction_config& c : {kv_eviction_config{kv_policy::h2o, 32, -1, 8, 16}, kv_eviction_config{},
                                      kv_eviction_config{kv_policy::scissorhands, 40, -1, -1, 4}}) {
    p.eviction = c;
    auto got = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
    REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.err().message));
    REQUIRE(got->eviction.has_value());
    CHECK(got->eviction->policy == c.policy);
    CHECK(got->eviction->budget == c.budget);
    CHECK(got->eviction->window == c.window);
    CHECK(got->eviction->history == c.history);
  }
  // Streaming may ask for more tokens than the context; the others may not.
  p.eviction = kv_eviction_config{kv_policy::streaming, 32, 4, -1, 16};
  p.max_tokens = 1000;
  auto past = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
  REQUIRE_MESSAGE(past.has_value(), (past ? "" : past.err().message));
  CHECK(past->max_tokens == 1000);
  CHECK(past->eviction->sinks == 4);
  p.eviction->policy = kv_policy::h2o;
  CHECK_FALSE(decode_generate_request(encode_generate_request_text("Once", p), tok, lim).has_value());
  p.max_tokens = 4;
  auto says = [&](const kv_eviction_config& c, const std::string& part) {
    p.eviction = c;
    auto bad = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
    REQUIRE_FALSE(bad.has_value());
    CAPTURE(bad.err().message);
    CHECK(bad.err().message.find(part) != std::string::npos);
  };
  says({kv_policy::streaming, 8, 4, 8, 16}, "kvEviction: a KV budget of 8 tokens cannot hold 4 sinks and a window of 8");
  says({kv_policy::h2o, 0, -1, -1, 16}, "kvEviction: KV policy h2o needs budget of 2 tokens or more");
  says({kv_policy::h2o, 65, -1, -1, 16}, "past the model's context of 64");
  says({kv_policy::scissorhands, 32, -1, -1, 33}, "history must be 1 to 32");
  // A policy number this side does not know.
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::GenerateRequest>();
  r.initPrompt().setText("Once");
  r.setMaxTokens(4);
  auto e = r.initKvEviction();
  e.setPolicy(static_cast<schema::KvPolicy>(9));
  e.setBudget(32);
  auto unknown = decode_generate_request(to_bytes(msg), tok, lim);
  REQUIRE_FALSE(unknown.has_value());
  CHECK(unknown.err().message == "kvEviction: policy 9 is none, streaming, h2o or scissorhands");
}

TEST_CASE("a request's logit biases travel with it, and a token outside the vocabulary or a bad bias is refused") {
  const tokenizer& tok = test::tok512();
  const request_limits lim = with_context(64);
  request_params p;
  p.max_tokens = 4;
  p.sampling.logit_bias = {{7, -100.0f}, {511, 2.5f}, {0, 100.0f}};
  auto got = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
  REQUIRE(got.has_value());
  CHECK(got->sampling.logit_bias == p.sampling.logit_bias);
  p.sampling.logit_bias = {{512, 1.0f}};
  auto outside = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
  REQUIRE_FALSE(outside.has_value());
  CHECK(outside.err().message == "logit bias: token 512 is outside the vocabulary");
  p.sampling.logit_bias = {{5, 1.0f}, {5, 2.0f}};
  auto twice = decode_generate_request(encode_generate_request_text("Once", p), tok, lim);
  REQUIRE_FALSE(twice.has_value());
  CHECK(twice.err().message == "logit bias: token 5 appears twice");
  p.sampling.logit_bias = {{5, -101.0f}};
  CHECK_FALSE(decode_generate_request(encode_generate_request_text("Once", p), tok, lim).has_value());
}

TEST_CASE("each API key has a prefix-cache namespace of its own, unless the cache is shared") {
  const uint64_t a = cache_namespace_of("key-one", true), b = cache_namespace_of("key-two", true);
  CHECK(a != 0);
  CHECK(b != 0);
  CHECK(a != b);
  CHECK(cache_namespace_of("key-one", true) == a);
  CHECK(cache_namespace_of("key-one", false) == 0);
  CHECK(cache_namespace_of("", true) == 0);
}

TEST_CASE("a failed request's error kind travels with its text, through the router's split too") {
  step_output out;
  out.id = request_id{7};
  out.finished = true;
  for (const error_code k : {error_code::invalid, error_code::unavailable, error_code::internal}) {
    const auto bytes = encode_generate_result(7, out, 0, "why", k);
    auto v = decode_generate_result(bytes);
    REQUIRE(v.has_value());
    CHECK(v->error == "why");
    CHECK(v->error_type == k);
    auto split = split_final_result(bytes, 99, 3);
    REQUIRE(split.has_value());
    auto w = decode_generate_result(split->result);
    REQUIRE(w.has_value());
    CHECK(w->request == 99);
    CHECK(w->error_type == k);
  }
  // Without an error the kind is not set; an unknown kind reads as invalid.
  auto fine = decode_generate_result(encode_generate_result(7, out, 0));
  REQUIRE(fine.has_value());
  CHECK(fine->error.empty());
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::GenerateResult>();
  r.setReason(schema::FinishReason::ERROR);
  r.setError("from a newer server");
  r.setErrorKind(static_cast<schema::ErrorKind>(9));
  auto unknown = decode_generate_result(to_bytes(msg));
  REQUIRE(unknown.has_value());
  CHECK(unknown->error_type == error_code::invalid);
}

TEST_CASE("a frame whose root pointer leaves the message, or is no struct, is an error in every decoder") {
  // One segment of one word: a struct pointer 100 words past the end; then a list pointer.
  const std::vector<uint8_t> out_of_bounds = {0, 0, 0, 0, 1, 0, 0, 0, 0x90, 0x01, 0, 0, 1, 0, 0, 0};
  std::vector<uint8_t> list = out_of_bounds;
  list[8] = 0x01;  // a list pointer, offset 0
  list[9] = 0;
  for (const auto& bytes : {out_of_bounds, list}) {
    auto result = decode_generate_result(bytes);
    REQUIRE_FALSE(result.has_value());
    CHECK(result.err().message.find("malformed frame") != std::string::npos);
    CHECK_FALSE(split_final_result(bytes, 1, 1).has_value());
    CHECK_FALSE(decode_token_chunk(bytes).has_value());
    CHECK_FALSE(decode_generate_request(bytes, test::tok512(), request_limits{512}).has_value());
  }
}

}  // namespace troupe::wire
