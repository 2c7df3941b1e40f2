// Disaggregation's shard side: a prefill shard's blocks reach the decode shard's first
// tier over the KV channel under the names its loads look for, byte for byte; blocks of
// failed requests, of another shard, or for a replica that is not there do not land.
#include <cstring>
#include <random>

#include <unistd.h>

#include <doctest/doctest.h>

#include "engine/forward/shard_push.hpp"
#include "engine/util/tcp.hpp"

namespace troupe {

namespace {

kv_cache_shape shape() {
  kv_cache_shape s;
  s.num_layers = 2;
  s.num_blocks = 8;
  s.num_kv_heads = 2;
  s.block_size = 4;
  s.head_dim = 8;
  return s;
}

std::vector<std::byte> random_block(const kv_cache& c, uint32_t seed) {
  std::vector<std::byte> b(static_cast<size_t>(c.block_bytes()));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (size_t i = 0; i + 4 <= b.size(); i += 4) {
    const float f = u(gen);
    std::memcpy(b.data() + i, &f, 4);
  }
  return b;
}

std::shared_ptr<kv_tiers> host_tiers() {
  std::vector<std::unique_ptr<kv_tier_store>> stores;
  stores.push_back(make_host_store(uint64_t{16} << 20));
  return std::make_shared<kv_tiers>(std::move(stores));
}

tier_move move(uint64_t id, uint32_t block, uint64_t key, std::string to = "d0") {
  return tier_move{request_id{id}, block_id{block}, tier_key{key, key * 3}, std::move(to)};
}

}  // namespace

TEST_CASE("pushed blocks land in the decode shard's first tier, byte for byte, before push returns") {
  kv_cache prefill(shape());
  const std::string prefix = "model/L0-2/tp0of1/f32/b4/";
  auto tiers = host_tiers();
  auto landing = kv_landing::start("127.0.0.1", 0, prefix, tiers);
  REQUIRE(landing);
  std::vector<std::vector<std::byte>> blocks;
  for (uint32_t b = 0; b < 4; ++b) {
    blocks.push_back(random_block(prefill, 100 + b));
    prefill.write_block(b, blocks.back());
  }
  shard_push push(prefix, prefill, {kv_peer{"d0", "127.0.0.1", (*landing)->port()}});
  const std::vector<tier_move> moves{move(1, 0, 10), move(1, 2, 12), move(2, 3, 13)};
  push.push(moves, std::vector<request_id>{request_id{2}});  // request 2's loads failed
  CHECK(push.stats().blocks == 2);
  CHECK(push.stats().failed == 0);
  CHECK((*landing)->stats().records == 2);  // taken before push returned

  std::vector<std::byte> out(blocks[0].size());
  REQUIRE(tiers->load(prefix + moves[0].key.hex(), out));
  CHECK(out == blocks[0]);
  REQUIRE(tiers->load(prefix + moves[1].key.hex(), out));
  CHECK(out == blocks[2]);
  CHECK_FALSE(tiers->load(prefix + moves[2].key.hex(), out));
}

TEST_CASE("a block under another shard's prefix is dropped, and an absent replica costs a count, not a wait") {
  kv_cache prefill(shape());
  auto tiers = host_tiers();
  auto landing = kv_landing::start("127.0.0.1", 0, "model/L2-4/tp0of1/f32/b4/", tiers);
  REQUIRE(landing);
  shard_push wrong("model/L0-2/tp0of1/f32/b4/", prefill, {kv_peer{"d0", "127.0.0.1", (*landing)->port()}});
  wrong.push(std::vector<tier_move>{move(1, 0, 10)}, {});
  CHECK(wrong.stats().blocks == 1);  // sent and taken...
  CHECK((*landing)->foreign() == 1);  // ...but not kept
  std::vector<std::byte> out(static_cast<size_t>(prefill.block_bytes()));
  CHECK_FALSE(tiers->load("model/L0-2/tp0of1/f32/b4/" + move(1, 0, 10).key.hex(), out));

  // No such replica, and one whose port nobody listens on.
  auto gone = kv_landing::start("127.0.0.1", 0, "p/", host_tiers());
  REQUIRE(gone);
  const uint16_t dead_port = (*gone)->port();
  gone->reset();
  shard_push lost("p/", prefill, {kv_peer{"d1", "127.0.0.1", dead_port}});
  lost.push(std::vector<tier_move>{move(1, 0, 10, "d9"), move(1, 1, 11, "d1"), move(1, 2, 12, "d1")}, {});
  CHECK(lost.stats().blocks == 0);
  CHECK(lost.stats().failed == 3);
}

}  // namespace troupe

namespace troupe {

TEST_CASE("a receiver that never acknowledges costs one flush, then is left alone") {
  // A port that takes connections (the kernel's backlog) but never answers: a hung node.
  auto hung = tcp::listen_on("127.0.0.1", 0, "a hung receiver");
  REQUIRE(hung);
  kv_cache prefill(shape());
  shard_push push("p/", prefill, {kv_peer{"d0", "127.0.0.1", hung->port}});
  push.push(std::vector<tier_move>{move(1, 0, 10), move(1, 1, 11)}, {});
  CHECK(push.stats().blocks == 2);  // written into the socket...
  CHECK(push.stats().failed == 1);  // ...never acknowledged
  // Left alone now: the next step's blocks are not sent there at all.
  push.push(std::vector<tier_move>{move(2, 2, 12), move(2, 3, 13)}, {});
  CHECK(push.stats().blocks == 2);
  CHECK(push.stats().failed == 3);
  ::close(hung->fd);
}

}  // namespace troupe
