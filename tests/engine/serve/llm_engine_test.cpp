// The serving loop on a real model: a randomized workload with preemption and cancels,
// and a shared prefix computed once.
#include "engine/serve/llm_engine.hpp"

#include <functional>
#include <map>

#include <doctest/doctest.h>

#include "engine/forward/kv_cache_type.hpp"
#include "engine/generate/generator.hpp"
#include "engine/sample/rng.hpp"
#include "kernels/cpu/sample.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

TEST_CASE("randomized arrivals, cancels and preemption: every request ends once, no block leaks, outputs as alone") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  for (uint64_t seed : {1u, 2u}) {
    CAPTURE(seed);
    rng r(seed);
    const int num_requests = 200;
    struct planned {
      request_params p;
      int arrival_step;
      int cancel_step;  // -1: never
    };
    std::vector<planned> plan;
    for (int i = 0; i < num_requests; ++i) {
      planned x;
      const int len = 1 + static_cast<int>(r.next() % 40);
      x.p.prompt.push_back(1);
      for (int k = 1; k < len; ++k) x.p.prompt.push_back(3 + static_cast<int32_t>(r.next() % 500));
      // A third of the prompts share a 20-token beginning, so prefix hits happen too.
      if (i % 3 == 0)
        for (int k = 1; k < std::min<int>(len, 21); ++k) x.p.prompt[k] = 260 + k;
      x.p.sampling.temperature = 0.0f;
      x.p.max_tokens = 1 + static_cast<int32_t>(r.next() % 30);
      x.arrival_step = static_cast<int>(r.next() % 120);
      x.cancel_step = r.next() % 8 == 0 ? x.arrival_step + static_cast<int>(r.next() % 10) : -1;
      plan.push_back(std::move(x));
    }
    engine_config cfg;
    cfg.sched.kv.num_blocks = 24;  // 384 token slots for up to ~40 live requests: preemption
    cfg.sched.kv.block_size = 16;
    cfg.sched.max_step_tokens = 64;
    cfg.sched.max_running = 16;
    cfg.num_threads = 2;
    llm_engine engine(l.m, l.tok, cfg);

    std::map<uint64_t, std::vector<int32_t>> tokens;
    std::map<uint64_t, int> endings;
    std::map<uint64_t, finish_reason> reasons;
    int step = 0;
    size_t added = 0;
    while (added < plan.size() || engine.has_unfinished()) {
      for (size_t i = 0; i < plan.size(); ++i) {
        if (plan[i].arrival_step == step) {
          REQUIRE(engine.add_request(request_id{i}, plan[i].p).has_value());
          ++added;
        }
        if (plan[i].cancel_step == step)
          if (auto out = engine.abort(request_id{i})) {
            ++endings[i];
            reasons[i] = out->reason;
          }
      }
      for (const step_output& o : engine.step()) {
        auto& t = tokens[o.id.value];
        t.insert(t.end(), o.new_tokens.begin(), o.new_tokens.end());
        if (o.finished) {
          ++endings[o.id.value];
          reasons[o.id.value] = o.reason;
        }
      }
      ++step;
      REQUIRE(step < 5000);
    }
    CHECK(engine.stats().preemptions > 0);
    CHECK(engine.kv().used == 0);
    CHECK(engine.kv().free == cfg.sched.kv.num_blocks);
    CHECK(engine.kv().hit_tokens > 0);
    int cancelled = 0;
    generator alone(l.m, l.tok, generator_options{});
    for (size_t i = 0; i < plan.size(); ++i) {
      CAPTURE(i);
      REQUIRE(endings[i] == 1);
      if (reasons[i] == finish_reason::aborted) {
        ++cancelled;
        continue;
      }
      auto ref = alone.generate({plan[i].p});
      REQUIRE(ref.has_value());
      CHECK(tokens[i] == (*ref)[0].tokens);
    }
    CHECK(cancelled > 0);
  }
}

TEST_CASE("a 400-token shared prefix is computed once for 32 requests with distinct suffixes") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.gguf");
  std::vector<int32_t> prefix{1};
  rng r(9);
  for (int i = 0; i < 400; ++i) prefix.push_back(3 + static_cast<int32_t>(r.next() % 500));
  std::vector<generation_request> reqs;
  for (int i = 0; i < 32; ++i) {
    generation_request g;
    g.prompt = prefix;
    for (int k = 0; k < 16; ++k) g.prompt.push_back(3 + static_cast<int32_t>((i * 37 + k * 11) % 500));
    g.sampling.temperature = 0.0f;
    g.max_tokens = 4;
    g.ignore_eos = true;
    reqs.push_back(g);
  }
  generator_options with;
  with.max_step_tokens = 256;
  generator cached(l.m, l.tok, with);
  auto a = cached.generate(reqs);
  REQUIRE(a.has_value());
  // 401 prefix tokens (with BOS) once: 400 of them in cached full blocks, plus every
  // request's own tokens from the first uncached block on.
  const uint64_t prompt_tokens = cached.last_stats().prompt_tokens_computed;
  const uint64_t shared_blocks = 401 / 16;  // 25 full blocks shared
  const uint64_t per_request = 417 - shared_blocks * 16;
  CHECK(prompt_tokens == shared_blocks * 16 + 32 * per_request);

  with.prefix_caching = false;
  generator uncached(l.m, l.tok, with);
  auto b = uncached.generate(reqs);
  REQUIRE(b.has_value());
  CHECK(uncached.last_stats().prompt_tokens_computed == 32u * 417u);
  for (size_t i = 0; i < reqs.size(); ++i) CHECK((*a)[i].tokens == (*b)[i].tokens);
}

namespace {

struct streamed {
  std::vector<int32_t> tokens;
  std::vector<std::string> text_after;  // the text streamed once tokens[0..i] were out
  std::string text;                     // everything, the finishing text included
};

// Runs one request to its end, calling `between` after every step.
streamed run_one(llm_engine& engine, const request_params& p, const std::function<void(int)>& between = {}) {
  streamed out;
  REQUIRE(engine.add_request(request_id{1}, p).has_value());
  for (int step = 0; engine.has_unfinished(); ++step) {
    REQUIRE(step < 2000);
    for (const step_output& o : engine.step()) {
      out.text += o.text;
      for (int32_t t : o.new_tokens) out.tokens.push_back(t);
      if (!o.new_tokens.empty()) out.text_after.push_back(out.text);
    }
    if (between) between(step);
  }
  return out;
}

}  // namespace

TEST_CASE("a request resumed with the output already delivered continues with the same tokens and text") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  request_params base;
  base.prompt = l.tok.encode("Once upon a time, there was a", true);
  base.max_tokens = 60;
  base.stop_strings = {"zzz"};  // held-back text must replay too
  engine_config cfg;
  for (float temperature : {0.0f, 1.0f}) {
    CAPTURE(temperature);
    request_params p = base;
    p.sampling.temperature = temperature;
    p.sampling.seed = 7;
    p.sampling.repetition_penalty = 1.1f;
    p.sampling.frequency_penalty = 0.5f;
    llm_engine whole(l.m, l.tok, cfg);
    const streamed all = run_one(whole, p);
    REQUIRE(all.tokens.size() > 20);
    for (size_t k : {size_t{1}, size_t{9}, all.tokens.size() - 1}) {
      CAPTURE(k);
      request_params resumed = p;
      resumed.delivered.assign(all.tokens.begin(), all.tokens.begin() + static_cast<ptrdiff_t>(k));
      llm_engine again(l.m, l.tok, cfg);
      const streamed rest = run_one(again, resumed);
      std::vector<int32_t> joined(resumed.delivered);
      joined.insert(joined.end(), rest.tokens.begin(), rest.tokens.end());
      CHECK(joined == all.tokens);
      CHECK(all.text_after[k - 1] + rest.text == all.text);
    }
  }
  // More output delivered than max_tokens allows, or tokens outside the vocabulary: refused.
  llm_engine e(l.m, l.tok, cfg);
  request_params over = base;
  over.delivered.assign(static_cast<size_t>(base.max_tokens) + 1, 5);
  CHECK_FALSE(e.add_request(request_id{2}, over).has_value());
  request_params bad = base;
  bad.delivered = {l.m.config.vocab_size};
  CHECK_FALSE(e.add_request(request_id{3}, bad).has_value());
  CHECK_FALSE(e.has_unfinished());
}

TEST_CASE("a resubmission whose whole output was delivered ends at once, with nothing new") {
  // Its client saw the final chunk but lost the end (its gateway died in between).
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  engine_config cfg;
  llm_engine e(l.m, l.tok, cfg);
  request_params p;
  p.prompt = l.tok.encode("Once upon a time", true);
  p.max_tokens = 12;
  p.stop_strings = {"zzz"};
  const std::vector<int32_t> words = l.tok.encode(" and then the dog ran to the park with his friend", false);
  REQUIRE(words.size() >= 12);
  SUBCASE("max_tokens delivered: it ends by length") {
    p.delivered.assign(words.begin(), words.begin() + 12);
    REQUIRE(e.add_request(request_id{1}, p).has_value());
    REQUIRE(e.has_unfinished());
    const std::vector<step_output> outs = e.step();
    REQUIRE(outs.size() == 1);
    CHECK(outs[0].finished);
    CHECK(outs[0].reason == finish_reason::length);
    CHECK(outs[0].num_output_tokens == 12);
    CHECK(outs[0].new_tokens.empty());
    CHECK(outs[0].text.empty());  // the final chunk before said all of it
  }
  SUBCASE("a stop string within what was delivered: it ends by stop") {
    p.max_tokens = 40;
    p.stop_strings = {"dog"};
    p.delivered = words;
    REQUIRE(e.add_request(request_id{1}, p).has_value());
    const std::vector<step_output> outs = e.step();
    REQUIRE(outs.size() == 1);
    CHECK(outs[0].finished);
    CHECK(outs[0].reason == finish_reason::stop);
  }
  SUBCASE("the whole context delivered: it ends by length") {
    p.max_tokens = 100000;
    p.delivered.assign(static_cast<size_t>(l.m.config.max_seq_len) - p.prompt.size(), words[0]);
    REQUIRE(e.add_request(request_id{1}, p).has_value());
    const std::vector<step_output> outs = e.step();
    REQUIRE(outs.size() == 1);
    CHECK(outs[0].reason == finish_reason::length);
  }
  CHECK(e.stats().tokens_computed == 0);  // nothing was computed for it
  CHECK(e.step().empty());
  CHECK_FALSE(e.has_unfinished());
}

TEST_CASE("reset_kv mid-generation: every running request recomputes and yields the same tokens") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  request_params p;
  p.prompt = l.tok.encode("The little dog", true);
  p.sampling.temperature = 0.0f;
  p.max_tokens = 50;
  engine_config cfg;
  llm_engine plain(l.m, l.tok, cfg);
  const streamed ref = run_one(plain, p);
  llm_engine reset(l.m, l.tok, cfg);
  size_t sent_back = 0;
  const streamed got = run_one(reset, p, [&](int step) {
    if (step == 5 || step == 20) {
      sent_back += reset.reset_kv();
      CHECK(reset.kv().used == 0);
      CHECK(reset.kv().cached == 0);
      CHECK(reset.num_running() == 0);
    }
  });
  CHECK(sent_back == 2);
  CHECK(got.tokens == ref.tokens);
  CHECK(got.text == ref.text);
}

TEST_CASE("an engine on a GPU that cannot be had is an error naming the device, not a crash") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  engine_config cfg;
  auto e = llm_engine::on_gpu(l.m, l.tok, cfg, gpu_placement{63, dtype::f32});  // no machine here has 64 devices
  REQUIRE_FALSE(e.has_value());
  CHECK(e.err().message.find("cuda:63") != std::string::npos);
  auto q = llm_engine::on_gpu(l.m, l.tok, cfg, gpu_placement{0, dtype::q8_0});
  REQUIRE_FALSE(q.has_value());
  // (A build without CUDA says so before it looks at the weights.)
  CHECK((q.err().message.find("must be f32, bf16 or f16") != std::string::npos ||
         q.err().message.find("has no CUDA") != std::string::npos));
  cfg.kv_type = dtype::q8_0;
  auto kv = llm_engine::on_gpu(l.m, l.tok, cfg, gpu_placement{0, dtype::f32});
  REQUIRE_FALSE(kv.has_value());
  CHECK(kv.err().message.find("KV cache type") != std::string::npos);
}

namespace {

// A CPU shard that chooses tokens where its logits are, as a GPU shard does on the device:
// forward_choose computes the logits and applies each row's choice (kernels/cpu/sample's
// definition, which the GPU samplers follow). It counts the steps it chose.
class choosing_shard final : public forward_shard {
 public:
  choosing_shard(const model& m, uint32_t num_blocks, int32_t block_size)
      : m_(m),
        pool_(1),
        cache_(transformer_shard::cache_shape(m.config, shard_spec{}, static_cast<int32_t>(num_blocks), block_size,
                                              kv_cache_type_for(m))),
        inner_(m, shard_spec{}, cache_, pool_, solo_) {}
  void forward(const step_batch& b, float* hidden, float* logits) override { inner_.forward(b, hidden, logits); }
  bool forward_choose(const step_batch& b, float* hidden, const token_choice* choices, int32_t* next) override {
    const int32_t vocab = m_.config.vocab_size;
    logits_.resize(static_cast<size_t>(b.num_logits()) * vocab);
    inner_.forward(b, hidden, logits_.data());
    for (int32_t r = 0; r < b.num_logits(); ++r) next[r] = choose(logits_.data() + size_t(r) * vocab, vocab, choices[r], scratch_);
    ++chose;
    return true;
  }
  bool is_first_stage() const override { return true; }
  bool is_last_stage() const override { return true; }
  const shard_spec& spec() const override { return inner_.spec(); }
  int chose = 0;

 private:
  const model& m_;
  thread_pool pool_;
  kv_cache cache_;
  no_collective solo_;
  transformer_shard inner_;
  std::vector<float> logits_;
  sample_scratch scratch_;
};

}  // namespace

TEST_CASE("tokens chosen on the shard are the tokens each request's sampler would choose, steps with penalties excepted") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  std::vector<request_params> reqs;
  const char* prompts[] = {"Once upon a time", "The little dog", "Lily and Tom", "One day"};
  for (int i = 0; i < 4; ++i) {
    request_params p;
    p.prompt = l.tok.encode(prompts[i], true);
    p.max_tokens = 40;
    p.sampling.seed = 11 + i;
    if (i == 0) p.sampling.temperature = 0.0f;
    if (i == 1) p.sampling.temperature = 0.9f, p.sampling.top_p = 0.9f;
    if (i == 2) p.sampling.temperature = 1.0f, p.sampling.top_k = 20, p.sampling.min_p = 0.05f;
    reqs.push_back(std::move(p));
  }
  auto run = [&](llm_engine& e, const std::vector<request_params>& rs) {
    std::map<uint64_t, std::vector<int32_t>> out;
    for (size_t i = 0; i < rs.size(); ++i) REQUIRE(e.add_request(request_id{i}, rs[i]).has_value());
    for (int step = 0; e.has_unfinished(); ++step) {
      REQUIRE(step < 2000);
      for (const step_output& o : e.step()) out[o.id.value].insert(out[o.id.value].end(), o.new_tokens.begin(), o.new_tokens.end());
    }
    return out;
  };
  engine_config cfg;
  cfg.sched.kv.num_blocks = 64;
  cfg.sched.max_step_tokens = 16;  // prompts in chunks beside other requests' decode tokens
  int chose_without_penalty = 0;
  for (bool penalty : {false, true}) {
    CAPTURE(penalty);
    std::vector<request_params> rs = reqs;
    if (penalty) rs[3].sampling.repetition_penalty = 1.3f;  // its steps go through the logits
    llm_engine plain(l.m, l.tok, cfg);
    auto shard = std::make_unique<choosing_shard>(l.m, cfg.sched.kv.num_blocks, cfg.sched.kv.block_size);
    choosing_shard& chooser = *shard;
    llm_engine choosing(l.m, l.tok, cfg, std::move(shard));
    const auto want = run(plain, rs), got = run(choosing, rs);
    for (size_t i = 0; i < rs.size(); ++i) {
      CAPTURE(i);
      REQUIRE(want.at(i).size() > 10);
      CHECK(got.at(i) == want.at(i));
    }
    // Without the penalty every sampling step chose on the shard; with it, the steps that
    // sample the penalized request go through the logits.
    CHECK(chooser.chose > 0);
    if (penalty)
      CHECK(chooser.chose < chose_without_penalty);
    else
      chose_without_penalty = chooser.chose;
  }
}

}  // namespace troupe
