// The GPU shard end to end on stories260K: the FP32 path gives the reference greedy ids,
// the BF16 path's logits stay close to the CPU's. Runs only where a CUDA device exists.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <doctest/doctest.h>

#include "engine/forward/cuda_shard.hpp"
#include "engine/forward/forward_shard.hpp"
#include "engine/forward/transformer_shard.hpp"
#include "engine/model/checkpoint_writer.hpp"
#include "engine/serve/llm_engine.hpp"
#include "engine/sample/rng.hpp"
#include "kernels/cpu/sample.hpp"
#include "kernels/cuda/gemv.hpp"
#include "kernels/cpu/argmax.hpp"
#include "tests/support/test_support.hpp"
#include "tests/support/tolerance.hpp"

namespace troupe {

namespace {

// Prompt in one step, then one token a step; stops at BOS/EOS or once position steps - 1
// has been fed (the reference's rule: steps ids after BOS). Returns the generated ids.
// on_device: the shard chooses (forward_greedy), else the CPU's argmax over its logits.
std::vector<int32_t> greedy(forward_shard& shard, const test::loaded& l, const std::vector<int32_t>& prompt, int32_t steps,
                            bool on_device) {
  const model_config& c = l.m.config;
  const std::vector<block_id> table = test::block_range((c.max_seq_len + 15) / 16);
  std::vector<float> hidden, logits(c.vocab_size);
  std::vector<int32_t> out;
  std::vector<int32_t> feed = prompt;
  int32_t pos = 0;
  while (pos + static_cast<int32_t>(feed.size()) <= steps) {
    step_batch b;
    b.add(feed, pos, table, true);
    hidden.assign(size_t(b.num_tokens()) * c.dim, 0.0f);
    int32_t next = 0;
    if (on_device) {
      const token_choice greedy = token_choice::greedy();
      REQUIRE(shard.forward_choose(b, hidden.data(), &greedy, &next));
    } else {
      shard.forward(b, hidden.data(), logits.data());
      next = argmax(logits.data(), c.vocab_size);
    }
    pos += static_cast<int32_t>(feed.size());
    if (next == l.tok.bos_id() || next == l.tok.eos_id()) break;
    out.push_back(next);
    feed = {next};
  }
  return out;
}

// The first index where a and b differ (their common length when one is a prefix).
size_t first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

TEST_CASE("GPU FP32 path: logits follow the CPU's token by token along a reference sequence") {
  // Teacher forcing: BOS and the reference ids, one token a step through both shards; the
  // logits of every step compared. Tells a numerical drift (tiny differences, a flip at a
  // near tie) from a wrong kernel (large differences from some position on).
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const model_config& c = l.m.config;
  const auto cases = test::read_reference(test::shared_path("reference/stories260K_greedy.jsonl"));
  REQUIRE(!cases.empty());
  std::vector<int32_t> ids{l.tok.bos_id()};
  ids.insert(ids.end(), cases[0].ids_after_bos.begin(), cases[0].ids_after_bos.end());
  const std::vector<block_id> table = test::block_range((c.max_seq_len + 15) / 16);
  kv_cache cache(transformer_shard::cache_shape(c, shard_spec{}, static_cast<int32_t>(table.size()), 16, dtype::f32));
  thread_pool pool(1);
  no_collective solo;
  transformer_shard cpu(l.m, shard_spec{}, cache, pool, solo);
  cuda_shard_options o;
  o.weights = dtype::f32;
  o.num_blocks = static_cast<int32_t>(table.size());
  auto gpu = make_cuda_shard(l.m, shard_spec{}, o);
  REQUIRE_MESSAGE(gpu.has_value(), (gpu ? "" : gpu.err().message));
  std::vector<float> hidden(c.dim), want(c.vocab_size), got(c.vocab_size);
  double worst = 0.0;
  int32_t worst_at = -1, first_flip = -1;
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(ids.size()); ++pos) {
    step_batch b;
    const std::vector<int32_t> token{ids[pos]};
    b.add(token, pos, table, true);
    cpu.forward(b, hidden.data(), want.data());
    (*gpu)->forward(b, hidden.data(), got.data());
    const double diff = test::max_range_difference(got, want);
    if (!(diff <= worst)) worst = diff, worst_at = pos;
    if (first_flip < 0 && argmax(got.data(), c.vocab_size) != argmax(want.data(), c.vocab_size)) first_flip = pos;
  }
  MESSAGE("FP32 worst logit difference ", worst, " of the range, at position ", worst_at, "; first argmax difference at ",
          first_flip, " of ", ids.size() - 1);
  CHECK(worst <= 1e-4);
  CHECK(first_flip == -1);
}

TEST_CASE("GPU FP32 path: stories260K greedy ids equal the reference, with CUDA graphs and without, chosen on either side") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  for (auto [graph_max_tokens, on_device] : {std::pair{256, true}, std::pair{256, false}, std::pair{0, false}}) {
    CAPTURE(graph_max_tokens);
    CAPTURE(on_device);
    cuda_shard_options o;
    o.weights = dtype::f32;
    o.num_blocks = (l.m.config.max_seq_len + 15) / 16;
    o.graph_max_tokens = graph_max_tokens;
    auto shard = make_cuda_shard(l.m, shard_spec{0, 0, {}}, o);
    REQUIRE_MESSAGE(shard.has_value(), (shard ? "" : shard.err().message));
    for (const auto& c : test::read_reference(test::shared_path("reference/stories260K_greedy.jsonl"))) {
      CAPTURE(c.prompt);
      const auto prompt = l.tok.encode(c.prompt, true);
      std::vector<int32_t> ids(prompt.begin() + 1, prompt.end());
      const auto gen = greedy(**shard, l, prompt, c.steps, on_device);
      ids.insert(ids.end(), gen.begin(), gen.end());
      CAPTURE(first_difference(ids, c.ids_after_bos));
      CHECK(ids == c.ids_after_bos);
    }
  }
}

TEST_CASE("the engine loop on a GPU (FP32): every reference prompt at once, tokens chosen on the device, each the reference's") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const auto cases = test::read_reference(test::shared_path("reference/stories260K_greedy.jsonl"));
  engine_config cfg;
  cfg.sched.kv.num_blocks = static_cast<uint32_t>(cases.size() * ((l.m.config.max_seq_len + 15) / 16));
  cfg.sched.max_step_tokens = 64;  // prompts in chunks, beside other requests' decode tokens
  auto engine = llm_engine::on_gpu(l.m, l.tok, cfg, gpu_placement{0, dtype::f32});
  REQUIRE_MESSAGE(engine.has_value(), (engine ? "" : engine.err().message));
  std::vector<std::vector<int32_t>> ids(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    request_params p;
    p.prompt = l.tok.encode(cases[i].prompt, true);
    p.sampling.temperature = 0.0f;
    p.max_tokens = cases[i].steps - static_cast<int32_t>(p.prompt.size() - 1);
    ids[i].assign(p.prompt.begin() + 1, p.prompt.end());
    REQUIRE((*engine)->add_request(request_id{i}, std::move(p)).has_value());
  }
  size_t finished = 0;
  for (int step = 0; step < 10000 && (*engine)->has_unfinished(); ++step)
    for (const step_output& o : (*engine)->step()) {
      ids[o.id.value].insert(ids[o.id.value].end(), o.new_tokens.begin(), o.new_tokens.end());
      finished += o.finished;
    }
  CHECK(finished == cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].prompt);
    CAPTURE(first_difference(ids[i], cases[i].ids_after_bos));
    CHECK(ids[i] == cases[i].ids_after_bos);
  }
}

TEST_CASE("the engine loop on a GPU (FP32) under KV eviction: each policy's greedy tokens are the CPU engine's") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const char* prompts[] = {"Once upon a time", "Lily and Tom went to the", "The cat", "One day"};
  const kv_eviction_config policies[] = {{kv_policy::h2o, 48, -1, -1, 16},
                                         {kv_policy::scissorhands, 40, -1, 16, 8},
                                         {kv_policy::streaming, 32, 4, -1, 16},
                                         {kv_policy::h2o, 64, -1, 24, 16}};
  engine_config cfg;
  cfg.sched.kv.num_blocks = 64;
  cfg.sched.max_step_tokens = 64;
  auto run = [&](llm_engine& e) {
    for (size_t i = 0; i < std::size(prompts); ++i) {
      request_params p;
      p.prompt = l.tok.encode(prompts[i], true);
      p.sampling.temperature = 0.0f;
      p.max_tokens = 200;
      p.ignore_eos = true;
      p.eviction = policies[i];
      REQUIRE(e.add_request(request_id{i}, std::move(p)).has_value());
    }
    std::vector<std::vector<int32_t>> ids(std::size(prompts));
    for (int step = 0; step < 10000 && e.has_unfinished(); ++step)
      for (const step_output& o : e.step()) ids[o.id.value].insert(ids[o.id.value].end(), o.new_tokens.begin(), o.new_tokens.end());
    return ids;
  };
  llm_engine cpu(l.m, l.tok, cfg);
  const auto want = run(cpu);
  auto gpu = llm_engine::on_gpu(l.m, l.tok, cfg, gpu_placement{0, dtype::f32});
  REQUIRE_MESSAGE(gpu.has_value(), (gpu ? "" : gpu.err().message));
  const auto got = run(**gpu);
  CHECK((*gpu)->stats().evicted_tokens == cpu.stats().evicted_tokens);
  CHECK(cpu.stats().evicted_tokens > 0);
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(prompts[i]);
    CAPTURE(first_difference(got[i], want[i]));
    CHECK(got[i].size() == 200);
    CHECK(got[i] == want[i]);
  }
}

TEST_CASE("GPU BF16 path: graph replays give the kernel-by-kernel logits bit for bit, GEMV and cuBLAS agree") {
  // stories260K's shape with a hidden size the GEMV takes (a multiple of 8), random BF16
  // weights. Three sequences: a prompt each in one step of 10 tokens (cuBLAS: more rows
  // than the GEMV takes), then decode steps of 3 at new positions with new tokens, so every
  // replay must read that step's inputs, not those it was captured with.
  test::temp_dir dir;
  const test::loaded src = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  model_config shape = src.m.config;
  shape.hidden_dim = 192;
  const std::string path = dir.file("bf16.gguf");
  REQUIRE(write_gguf(path, {shape, dtype::bf16, 32, true}, src.tok.vocab(), random_weights(7)).has_value());
  const test::loaded l = test::load(path);
  const model_config& c = l.m.config;
  const int32_t per_seq = (c.max_seq_len + 15) / 16;
  std::vector<std::vector<block_id>> tables(3, std::vector<block_id>(per_seq));
  for (int s = 0; s < 3; ++s)
    for (int32_t b = 0; b < per_seq; ++b) tables[s][b] = block_id{static_cast<uint32_t>(b * 3 + s)};
  const std::vector<std::vector<int32_t>> prompts{{1, 5, 9}, {1, 7, 3, 8, 2}, {1, 4}};
  // Every step's logits (how == nullptr), or every step's device-chosen ids (how says how
  // to choose; each step's u in us).
  auto run = [&](int32_t graph_max_tokens, bool gemv, const truncation* how, std::vector<int32_t>* ids,
                 std::vector<float>* us = nullptr) {
    cuda_shard_options o;
    o.weights = dtype::bf16;
    o.num_blocks = 3 * per_seq;
    o.graph_max_tokens = graph_max_tokens;
    o.gemv_max_rows = gemv ? cuda::gemv_max_rows : 0;
    auto shard = make_cuda_shard(l.m, shard_spec{}, o);
    REQUIRE_MESSAGE(shard.has_value(), (shard ? "" : shard.err().message));
    std::vector<float> all, hidden(size_t(16) * c.dim), logits(size_t(3) * c.vocab_size);
    std::vector<int32_t> next(3);
    rng draws(99);
    auto step = [&](const step_batch& b) {
      if (how != nullptr) {
        std::vector<token_choice> choices(3, token_choice{*how, 0.0f});
        for (auto& ch : choices) {
          ch.u = draws.uniform();
          if (us != nullptr) us->push_back(ch.u);
        }
        REQUIRE((**shard).forward_choose(b, hidden.data(), choices.data(), next.data()));
        ids->insert(ids->end(), next.begin(), next.end());
      } else {
        (**shard).forward(b, hidden.data(), logits.data());
        all.insert(all.end(), logits.begin(), logits.end());
      }
    };
    step_batch first;
    for (int s = 0; s < 3; ++s) first.add(prompts[s], 0, tables[s], true);
    step(first);
    for (int32_t i = 0; i < 40; ++i) {
      step_batch d;
      for (int s = 0; s < 3; ++s) {
        const std::vector<int32_t> token{static_cast<int32_t>((i * 31 + s * 17) % c.vocab_size)};
        d.add(token, static_cast<int32_t>(prompts[s].size()) + i, tables[s], true);
      }
      step(d);
    }
    return all;
  };
  const auto eager = run(0, false, nullptr, nullptr);
  CHECK(run(256, false, nullptr, nullptr) == eager);
  const auto gemv_eager = run(0, true, nullptr, nullptr);
  CHECK(run(256, true, nullptr, nullptr) == gemv_eager);
  // Greedy on the device: each row's argmax of the same step's logits.
  const truncation greedy{0.0f, 0, 1.0f, 0.0f};
  std::vector<int32_t> ids;
  run(256, true, &greedy, &ids);
  REQUIRE(ids.size() * c.vocab_size == gemv_eager.size());
  for (size_t r = 0; r < ids.size(); ++r) CHECK(ids[r] == argmax(gemv_eager.data() + r * c.vocab_size, c.vocab_size));
  // A draw on the device: the CPU's draw from the same logits with the same u (the fed
  // tokens do not depend on the choices, so the logits are gemv_eager's).
  const truncation drawn{0.9f, 0, 0.95f, 0.0f};
  std::vector<float> us;
  ids.clear();
  run(256, true, &drawn, &ids, &us);
  REQUIRE(us.size() == ids.size());
  sample_scratch scratch;
  int32_t near_boundary = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    const float* row = gemv_eager.data() + r * c.vocab_size;
    const int32_t want = sample(row, c.vocab_size, drawn, us[r], scratch);
    if (ids[r] == want) continue;
    // Only a u within float rounding of a boundary between two tokens may go the other way.
    ++near_boundary;
    CHECK((ids[r] == sample(row, c.vocab_size, drawn, std::max(0.0f, us[r] - 1e-4f), scratch) ||
           ids[r] == sample(row, c.vocab_size, drawn, std::min(0.99999f, us[r] + 1e-4f), scratch)));
  }
  CHECK(near_boundary <= 2);
  const double worst = test::max_range_difference(gemv_eager, eager);
  MESSAGE("GEMV path against cuBLAS: worst logit difference ", worst, " of the logits' range");
  CHECK(worst <= 0.02);  // BF16 roundings of activations that differ in the last float bits
}

TEST_CASE("GPU BF16 path: prompt logits within 5% of the logit range of the CPU's") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const model_config& c = l.m.config;
  const auto prompt = l.tok.encode("Once upon a time, there was a little girl named Lily", true);
  const std::vector<block_id> table = test::block_range((c.max_seq_len + 15) / 16);
  step_batch b;
  b.add(prompt, 0, table, true);
  // CPU.
  kv_cache cache(transformer_shard::cache_shape(c, shard_spec{}, static_cast<int32_t>(table.size()), 16));
  thread_pool pool(1);
  no_collective solo;
  transformer_shard cpu(l.m, shard_spec{}, cache, pool, solo);
  std::vector<float> hidden(size_t(b.num_tokens()) * c.dim), want(c.vocab_size), got(c.vocab_size);
  cpu.forward(b, hidden.data(), want.data());
  // GPU, BF16 weights.
  cuda_shard_options o;
  o.weights = dtype::bf16;
  o.num_blocks = static_cast<int32_t>(table.size());
  auto gpu = make_cuda_shard(l.m, shard_spec{}, o);
  REQUIRE_MESSAGE(gpu.has_value(), (gpu ? "" : gpu.err().message));
  std::fill(hidden.begin(), hidden.end(), 0.0f);
  (*gpu)->forward(b, hidden.data(), got.data());
  const double worst = test::max_range_difference(got, want);
  MESSAGE("BF16 worst logit error ", worst, " of the logits' range");
  CHECK(worst <= 0.05);
}

}  // namespace troupe
