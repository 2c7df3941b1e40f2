#include "engine/kv/block_pool.hpp"

#include <doctest/doctest.h>

namespace troupe {

namespace {
std::vector<uint32_t> ids(const std::vector<block_id>& v) {
  std::vector<uint32_t> out;
  for (auto b : v) out.push_back(b.value);
  return out;
}
}  // namespace

TEST_CASE("blocks are handed out in id order, then least recently freed first") {
  block_pool pool(4);
  CHECK(pool.num_free() == 4);
  CHECK(pool.allocate()->value == 0);
  CHECK(pool.allocate()->value == 1);
  CHECK(pool.allocate()->value == 2);
  CHECK(ids(pool.free_order()) == std::vector<uint32_t>{3});
  pool.unref(block_id{1});
  pool.unref(block_id{0});
  CHECK(ids(pool.free_order()) == std::vector<uint32_t>{3, 1, 0});
  CHECK(pool.allocate()->value == 3);
  CHECK(pool.allocate()->value == 1);
  CHECK(pool.allocate()->value == 0);
  CHECK_FALSE(pool.allocate().has_value());
  CHECK(pool.num_free() == 0);
}

TEST_CASE("reference counts: a shared block is free only when the last holder lets go") {
  block_pool pool(3);
  const block_id a = *pool.allocate();
  pool.ref(a);
  CHECK(pool.ref_count(a) == 2);
  pool.unref(a);
  CHECK(pool.ref_count(a) == 1);
  CHECK(pool.num_free() == 2);
  pool.unref(a);
  CHECK(pool.ref_count(a) == 0);
  CHECK(ids(pool.free_order()) == std::vector<uint32_t>{1, 2, 0});
  // ref() on a free block (a cache hit) takes it out of the free list.
  pool.ref(a);
  CHECK(ids(pool.free_order()) == std::vector<uint32_t>{1, 2});
  CHECK(pool.ref_count(a) == 1);
}

}  // namespace troupe
