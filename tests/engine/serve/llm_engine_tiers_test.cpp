// KV tiers under the serving loop, on stories260K: prefixes the pool lost come back from
// host memory, a directory or Redis with the same tokens, and blocks corrupted in a tier are
// computed again.
#include <filesystem>

#include <doctest/doctest.h>

#include "engine/forward/kv_cache_type.hpp"
#include "engine/forward/shard_tiers.hpp"
#include "engine/kv/kv_tiers.hpp"
#include "engine/serve/llm_engine.hpp"
#include "tests/support/redis_server.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

const test::loaded& stories() {
  static const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  return l;
}

engine_config tiered(std::vector<tier_config> tiers) {
  engine_config cfg;
  cfg.sched.kv.num_blocks = 16;  // 256 slots: three other prompts push a prompt out
  cfg.sched.kv.block_size = 16;
  cfg.sched.max_step_tokens = 256;
  cfg.sched.kv.tiers = std::move(tiers);
  return cfg;
}

request_params prompt(int32_t first, int32_t len = 150, int32_t max_tokens = 24) {
  request_params p;
  p.prompt.push_back(1);
  for (int32_t k = 1; k < len; ++k) p.prompt.push_back(3 + (first + k * 7) % 500);
  p.sampling.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

struct result {
  std::vector<int32_t> tokens;
  int32_t cached = 0;
};

result run_one(llm_engine& e, uint64_t id, const request_params& p) {
  REQUIRE(e.add_request(request_id{id}, p));
  result r;
  for (int i = 0; i < 400 && e.has_unfinished(); ++i)
    for (const step_output& o : e.step()) {
      r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      r.cached = o.num_cached_prompt_tokens;
    }
  REQUIRE_FALSE(e.has_unfinished());
  return r;
}

// Prompts of other tokens, filling the pool so that nothing of before stays cached.
void churn(llm_engine& e, uint64_t first_id) {
  for (uint64_t k = 0; k < 3; ++k) run_one(e, first_id + k, prompt(100 + 37 * static_cast<int32_t>(k), 200, 4));
}

tier_config host() { return tier_config{}; }
tier_config disk(const std::string& dir) {
  tier_config t;
  t.kind = tier_kind::disk;
  t.path = dir;
  return t;
}

}  // namespace

TEST_CASE("a cache block's bytes go out and come back whole, in every cache type") {
  for (dtype type : {dtype::f32, dtype::f16, dtype::q8_0}) {
    CAPTURE(dtype_name(type));
    kv_cache_shape s{3, 4, 2, 16, 8, type};
    kv_cache a(s), b(s);
    std::vector<std::byte> bytes(static_cast<size_t>(a.block_bytes()));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 31 + 7);
    a.write_block(2, bytes);
    std::vector<std::byte> back(bytes.size());
    a.read_block(2, back);
    CHECK(back == bytes);
    a.read_block(1, back);  // other blocks untouched
    CHECK(std::all_of(back.begin(), back.end(), [](std::byte x) { return x == std::byte{0}; }));
    // The block's bytes are exactly the cache's share of it: num_blocks of them are all of it.
    CHECK(a.block_bytes() * s.num_blocks == a.bytes());
    b.write_block(0, bytes);
    b.read_block(0, back);
    CHECK(back == bytes);
  }
}

TEST_CASE("a prefix the pool lost comes back from host memory with the same tokens") {
  const auto& l = stories();
  llm_engine plain(l.m, l.tok, tiered({}));
  const result want = run_one(plain, 1, prompt(5));
  churn(plain, 10);
  CHECK(run_one(plain, 2, prompt(5)).cached == 0);  // without tiers: computed again

  llm_engine e(l.m, l.tok, tiered({host()}));
  CHECK(run_one(e, 1, prompt(5)).tokens == want.tokens);
  churn(e, 10);
  const result again = run_one(e, 2, prompt(5));
  CHECK(again.tokens == want.tokens);
  CHECK(again.cached == 144);  // nine whole blocks of the 150-token prompt
  CHECK(e.tiers().loaded_tokens == 144);
  CHECK(e.tiers().failed_loads == 0);
  const auto s = e.tier_figures();
  REQUIRE(s.size() == 1);
  CHECK(s[0].hits == 9);
  CHECK(s[0].bytes_out > 0);
}

// Token trees and tiers: each verified tree's kept path moves down in the KV, and the
// blocks it filled are saved only after the move. The target drafts for itself, so every
// tree keeps its first children, never where a chain would leave them: every verify moves.
// A prompt made of the first request's prompt and output loads those blocks from the tier
// and continues as plain decoding (a block saved before its move would not).
TEST_CASE("blocks a token tree filled reach the tier moved: a prompt over them continues as plain decoding") {
  const auto& l = stories();
  llm_engine plain(l.m, l.tok, tiered({}));
  const request_params p = prompt(5, 40, 120);
  const result want = run_one(plain, 1, p);
  engine_config cfg = tiered({host()});
  cfg.spec.method = spec_method::draft;
  cfg.spec.tree = {2, 2, 2};
  cfg.spec.max_step_tokens = 16;
  cfg.draft = &l.m;
  llm_engine e(l.m, l.tok, cfg);
  CHECK(run_one(e, 1, p).tokens == want.tokens);
  CHECK(e.stats().spec.kept_at[2] > 0);  // trees kept paths three deep: their KV moved
  churn(e, 10);
  request_params q = p;
  q.prompt.insert(q.prompt.end(), want.tokens.begin(), want.tokens.begin() + 100);
  q.max_tokens = 16;
  const uint64_t loaded = e.tiers().loaded_tokens;
  const result again = run_one(e, 2, q);
  CHECK(e.tiers().loaded_tokens - loaded == 128);  // blocks 2-7 hold generated tokens
  CHECK(e.tiers().failed_loads == 0);
  CHECK(again.tokens == run_one(plain, 2, q).tokens);
}

TEST_CASE("blocks flipped or cut in the disk tier are computed again, with the same tokens") {
  const auto& l = stories();
  llm_engine plain(l.m, l.tok, tiered({}));
  const result want = run_one(plain, 1, prompt(9));
  test::temp_dir dir;
  llm_engine e(l.m, l.tok, tiered({disk(dir.path())}));
  CHECK(run_one(e, 1, prompt(9)).tokens == want.tokens);
  churn(e, 10);
  e.flush_tiers();
  // Spoil every file: a flipped byte in some, a cut in the others.
  int n = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (f.path().extension() != ".kvb") continue;
    auto bytes = test::read_all(f.path().string());
    if (n++ % 2) bytes[bytes.size() - 3] ^= 0x40;
    else bytes.resize(bytes.size() / 2);
    test::write_all(f.path().string(), bytes);
  }
  REQUIRE(n > 9);
  const result again = run_one(e, 2, prompt(9));
  CHECK(again.tokens == want.tokens);
  CHECK(again.cached == 0);
  CHECK(e.tiers().failed_loads == 1);
  CHECK(e.tier_figures()[0].corrupt >= 1);
  // Computed again, its blocks were written again: the next time they load.
  churn(e, 20);
  e.flush_tiers();
  const result third = run_one(e, 3, prompt(9));
  CHECK(third.tokens == want.tokens);
  CHECK(third.cached == 144);
}

TEST_CASE("a fresh engine finds another's prefixes in Redis, and recomputes a block flipped there") {
  test::redis_server server;
  REQUIRE_MESSAGE(server.running(), server.skip_reason());
  tier_config redis;
  redis.kind = tier_kind::redis;
  redis.address = server.address();
  const auto& l = stories();
  llm_engine plain(l.m, l.tok, tiered({}));
  const result want = run_one(plain, 1, prompt(3));
  {
    llm_engine first(l.m, l.tok, tiered({host(), redis}));
    CHECK(run_one(first, 1, prompt(3)).tokens == want.tokens);
    first.flush_tiers();
    CHECK(first.tier_figures()[1].stored == 10);  // (the output fills a tenth block)
  }
  // A restart: an empty pool and host tier, the same Redis.
  llm_engine second(l.m, l.tok, tiered({host(), redis}));
  const result warm = run_one(second, 1, prompt(3));
  CHECK(warm.tokens == want.tokens);
  CHECK(warm.cached == 144);
  CHECK(second.tier_figures()[1].hits == 9);

  // Flip a byte of one block in Redis; a third engine finds it corrupt and computes.
  auto raw = make_redis_store(server.address(), 200).value();
  const std::string prefix = tier_prefix(l.m, shard_spec{}, transformer_shard::cache_shape(l.m.config, shard_spec{}, 16, 16, kv_cache_type_for(l.m)));
  const request_params p = prompt(3);
  tier_key k = tier_key::root(0);
  for (int b = 0; b < 5; ++b) k = k.chain(std::span(p.prompt).subspan(b * 16, 16));
  auto rec = raw->get(prefix + k.hex()).value();
  REQUIRE(rec);
  (*rec)[rec->size() / 2] ^= std::byte{1};
  REQUIRE(raw->put(prefix + k.hex(), *rec));
  llm_engine third(l.m, l.tok, tiered({redis}));
  const result cold = run_one(third, 1, prompt(3));
  CHECK(cold.tokens == want.tokens);
  CHECK(cold.cached == 0);
  CHECK(third.tier_figures()[0].corrupt == 1);
  CHECK(third.tiers().failed_loads == 1);

  // Redis gone: requests compute, errors are counted, nothing hangs.
  server.kill();
  llm_engine fourth(l.m, l.tok, tiered({redis}));
  const result away = run_one(fourth, 1, prompt(3));
  CHECK(away.tokens == want.tokens);
}

}  // namespace troupe
