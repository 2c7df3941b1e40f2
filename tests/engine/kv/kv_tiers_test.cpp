#include "engine/kv/kv_tiers.hpp"

#include <doctest/doctest.h>

#include <cstring>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/support/redis_server.hpp"
#include "tests/support/test_support.hpp"
#include "tests/support/eventually.hpp"

using namespace troupe;
using troupe::test::read_all;
using troupe::test::write_all;

namespace {

std::vector<std::byte> bytes_of(size_t n, uint64_t seed) {
  std::vector<std::byte> b(n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& v : b) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = static_cast<std::byte>(x);
  }
  return b;
}

std::vector<std::unique_ptr<kv_tier_store>> stores(std::unique_ptr<kv_tier_store> a,
                                                   std::unique_ptr<kv_tier_store> b = nullptr) {
  std::vector<std::unique_ptr<kv_tier_store>> out;
  out.push_back(std::move(a));
  if (b) out.push_back(std::move(b));
  return out;
}

std::vector<std::filesystem::path> block_files(const test::temp_dir& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    if (e.path().extension() == ".kvb") out.push_back(e.path());
  return out;
}

}  // namespace

TEST_CASE("a sealed record opens under its name only, and every flipped byte or cut is caught") {
  const auto payload = bytes_of(1000, 1);
  const auto rec = seal_record("m/L0-5/abc", payload);
  const auto opened = open_record("m/L0-5/abc", rec);
  REQUIRE(opened);
  CHECK(std::equal(opened->begin(), opened->end(), payload.begin(), payload.end()));
  CHECK_FALSE(open_record("m/L0-5/abd", rec));
  CHECK_FALSE(open_record("m/L0-5/abc", std::span(rec).first(rec.size() - 1)));
  CHECK_FALSE(open_record("m/L0-5/abc", std::span(rec).first(10)));
  for (size_t i = 0; i < rec.size(); ++i) {
    auto bad = rec;
    bad[i] ^= std::byte{0x10};
    CHECK_FALSE(open_record("m/L0-5/abc", bad));
  }
}

TEST_CASE("a record shorter than the name it claims is refused, whatever its length field says") {
  // The header (24 bytes) and 4 bytes where a 10-byte name should be; the length field set
  // to what size - header - name_len wraps to, which once passed the check.
  const auto rec = seal_record("m/L0-5/abc", {});
  std::vector<std::byte> cut(rec.begin(), rec.begin() + 24 + 4);
  const uint64_t wrapped = uint64_t{28} - 24 - 10;
  std::memcpy(cut.data() + 8, &wrapped, sizeof wrapped);
  CHECK_FALSE(open_record("m/L0-5/abc", cut));
  CHECK_FALSE(record_name(cut));
}

TEST_CASE("checksum64: every unit the CPU has gives the portable loop's sums, and any flipped bit changes it") {
  std::vector<std::byte> b(1000);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::byte(static_cast<uint8_t>(i * 37 + 11));
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{64}, size_t{999}, size_t{1000}}) {
    const auto part = std::span(b).first(n);
    const uint64_t want = *checksum64_on(checksum_unit::scalar, part, 5);
    CHECK(checksum64(part, 5) == want);
    for (checksum_unit u : {checksum_unit::sse2, checksum_unit::avx2})
      if (auto got = checksum64_on(u, part, 5)) CHECK(*got == want);
    CHECK(checksum64(part, 6) != want);  // the seed counts
  }
  const uint64_t whole = checksum64(b);
  for (size_t i = 0; i < b.size(); i += 7)
    for (int bit = 0; bit < 8; bit += 3) {
      b[i] ^= std::byte(1 << bit);
      CHECK(checksum64(b) != whole);
      b[i] ^= std::byte(1 << bit);
    }
  CHECK(checksum64(b) == whole);
}

TEST_CASE("tier keys chain a prefix block by block, per namespace") {
  const std::vector<int32_t> a{1, 2, 3, 4}, b{1, 2, 3, 5};
  const tier_key r = tier_key::root(0);
  CHECK(r.chain(a) == tier_key::root(0).chain(a));
  CHECK_FALSE(r.chain(a) == r.chain(b));
  CHECK_FALSE(r.chain(a) == tier_key::root(7).chain(a));
  // The same block after different prefixes is another key.
  CHECK_FALSE(r.chain(a).chain(b) == r.chain(b).chain(b));
  CHECK(r.chain(a).hex().size() == 32);
  CHECK_FALSE(r.chain(a).hex() == r.chain(b).hex());
}

TEST_CASE("the host tier keeps the most recently used blocks within its capacity") {
  kv_tiers tiers(stores(make_host_store(3 * 1100)));
  for (int i = 0; i < 4; ++i) tiers.save("b" + std::to_string(i), bytes_of(1000, i));
  std::vector<std::byte> out(1000);
  CHECK_FALSE(tiers.load("b0", out));  // the oldest went first
  for (int i = 1; i < 4; ++i) {
    REQUIRE(tiers.load("b" + std::to_string(i), out));
    CHECK(out == bytes_of(1000, i));
  }
  // A load of the wrong size is a miss, not a partial copy.
  std::vector<std::byte> small(999);
  CHECK_FALSE(tiers.load("b1", small));
  const auto s = tiers.stats();
  CHECK(s[0].hits == 3);
  CHECK(s[0].misses == 1);
  CHECK(s[0].bytes_out == 3000);
  CHECK(s[0].stored == 4);
}

TEST_CASE("the disk tier outlives its process, and a flipped or cut file is recomputed") {
  test::temp_dir dir;
  {
    auto disk = make_disk_store(dir.path(), 0);
    REQUIRE(disk);
    kv_tiers tiers(stores(make_host_store(0), std::move(disk).value()));
    for (int i = 0; i < 3; ++i) tiers.save("blk" + std::to_string(i), bytes_of(4096, i));
    tiers.flush();
    CHECK(tiers.stats()[1].stored == 3);
  }
  REQUIRE(block_files(dir).size() == 3);
  // A restart: an empty host tier, the disk's blocks found again and promoted.
  auto disk = make_disk_store(dir.path(), 0);
  REQUIRE(disk);
  kv_tiers tiers(stores(make_host_store(0), std::move(disk).value()));
  std::vector<std::byte> out(4096);
  REQUIRE(tiers.load("blk0", out));
  CHECK(out == bytes_of(4096, 0));
  auto s = tiers.stats();
  CHECK(s[0].misses == 1);
  CHECK(s[1].hits == 1);
  REQUIRE(tiers.load("blk0", out));
  CHECK(tiers.stats()[0].hits == 1);  // from host memory the second time

  // One file with a byte flipped, one cut short, one holding another block's record:
  // each a miss, counted as corrupt and deleted (blk0 is still in host memory).
  auto files = block_files(dir);
  for (size_t i = 0; i < files.size(); ++i) {
    auto bytes = read_all(files[i].string());
    if (i == 0) bytes[bytes.size() / 2] ^= 1;
    else if (i == 1) bytes.resize(bytes.size() - 100);
    write_all(files[i].string(), i == 2 ? read_all(files[0].string()) : bytes);
  }
  const tier_stats before = tiers.stats()[1];
  CHECK_FALSE(tiers.load("blk1", out));
  CHECK_FALSE(tiers.load("blk2", out));
  REQUIRE(tiers.load("blk0", out));
  CHECK(out == bytes_of(4096, 0));
  s = tiers.stats();
  CHECK(s[1].corrupt - before.corrupt == 2);
  CHECK(s[1].hits == before.hits);
  CHECK(block_files(dir).size() == 1);  // the two found corrupt are gone
}

TEST_CASE("a prefetch reads blocks up from a lower tier in the background, and the load then finds them in memory") {
  test::temp_dir dir;
  {
    kv_tiers writer(stores(make_host_store(0), make_disk_store(dir.path(), 0).value()));
    for (int i = 0; i < 3; ++i) writer.save("p" + std::to_string(i), bytes_of(4096, i));
    writer.flush();
  }
  kv_tiers tiers(stores(make_host_store(0), make_disk_store(dir.path(), 0).value()));
  const std::vector<std::string> names{"p0", "p1", "p9"};
  tiers.prefetch(names, 4096);
  tiers.flush();
  auto s = tiers.stats();
  CHECK(s[1].hits == 2);    // p0 and p1 read up
  CHECK(s[1].misses == 1);  // p9 is nowhere
  CHECK(s[0].stored == 2);
  std::vector<std::byte> out(4096);
  REQUIRE(tiers.load("p1", out));
  CHECK(out == bytes_of(4096, 1));
  s = tiers.stats();
  CHECK(s[0].hits == 1);  // from memory
  CHECK(s[1].hits == 2);
  // Blocks the first tier has already are not looked up again; one of another size is a miss.
  tiers.prefetch(std::vector<std::string>{"p0"}, 4096);
  tiers.prefetch(std::vector<std::string>{"p2"}, 100);
  tiers.flush();
  s = tiers.stats();
  CHECK(s[1].lookups == 4);
  CHECK(s[1].corrupt == 1);
}

TEST_CASE("the disk tier drops its least recently used files past its capacity") {
  test::temp_dir dir;
  auto disk = make_disk_store(dir.path(), 5 * 1100);
  REQUIRE(disk);
  auto* d = disk->get();
  for (int i = 0; i < 8; ++i) {
    const auto rec = seal_record("x" + std::to_string(i), bytes_of(1000, i));
    REQUIRE(d->put("x" + std::to_string(i), rec));
  }
  CHECK(block_files(dir).size() == 5);
  CHECK_FALSE(d->get("x0").value());
  CHECK(d->get("x7").value());
}

TEST_CASE("shards sharing a disk tier's directory each keep their own files, within their own capacity") {
  test::temp_dir dir;
  auto count = [&](const std::string& scope) {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(dir.path()) / scope))
      n += e.path().extension() == ".kvb";
    return n;
  };
  {
    auto a = make_disk_store(dir.path(), 3 * 1100, "shard-a").value();
    auto b = make_disk_store(dir.path(), 3 * 1100, "shard-b").value();
    for (int i = 0; i < 3; ++i) {
      REQUIRE(a->put("a" + std::to_string(i), seal_record("a" + std::to_string(i), bytes_of(1000, i))));
      REQUIRE(b->put("b" + std::to_string(i), seal_record("b" + std::to_string(i), bytes_of(1000, i))));
    }
  }
  CHECK(count("shard-a") == 3);
  CHECK(count("shard-b") == 3);
  // Shard a restarted: it finds its files, and its next one pushes out its oldest only.
  auto a = make_disk_store(dir.path(), 3 * 1100, "shard-a").value();
  REQUIRE(a->put("a9", seal_record("a9", bytes_of(1000, 9))));
  CHECK(count("shard-a") == 3);
  CHECK(count("shard-b") == 3);
  CHECK(a->leading_present(std::vector<std::string>{"a9"}).value() == 1);
  size_t left = 0;
  for (int i = 0; i < 3; ++i) left += a->get("a" + std::to_string(i)).value().has_value();
  CHECK(left == 2);  // (files of one second are ordered by name: which of them went is not fixed)
  CHECK(a->leading_present(std::vector<std::string>{"a9", "b0"}).value() == 1);
}

TEST_CASE("a disk tier in a directory that cannot be made is refused") {
  test::temp_dir dir;
  const std::filesystem::path file = dir.file("a-file");
  std::ofstream(file) << "x";
  auto disk = make_disk_store((file / "sub").string(), 0);
  REQUIRE_FALSE(disk);
  CHECK(disk.err().message.find("cannot make") != std::string::npos);
}

TEST_CASE("tier settings are checked") {
  tier_config c;
  c.kind = tier_kind::disk;
  CHECK(validate(c));
  c.kind = tier_kind::redis;
  for (const char* bad : {"", "localhost", ":6379", "host:", "host:0", "host:70000", "host:63x9"}) {
    c.address = bad;
    CHECK_MESSAGE(validate(c), bad);
  }
  c.address = "127.0.0.1:6379";
  CHECK_FALSE(validate(c));
  CHECK(parse_tier_kind("redis") == tier_kind::redis);
  CHECK_FALSE(parse_tier_kind("tape"));
}

TEST_CASE("the redis tier stores, detects flipped bytes, and degrades while the server is away") {
  test::redis_server server;
  REQUIRE_MESSAGE(server.running(), server.skip_reason());
  auto redis = make_redis_store(server.address(), 200);
  REQUIRE(redis);
  kv_tiers tiers(stores(make_host_store(0), std::move(redis).value()));
  tiers.save("r1", bytes_of(2048, 1));
  tiers.save("r2", bytes_of(2048, 2));
  tiers.flush();
  CHECK(tiers.stats()[1].stored == 2);

  // Another client (a restarted replica) finds them.
  auto other = make_redis_store(server.address(), 200);
  REQUIRE(other);
  kv_tiers fresh(stores(make_host_store(0), std::move(other).value()));
  std::vector<std::byte> out(2048);
  REQUIRE(fresh.load("r1", out));
  CHECK(out == bytes_of(2048, 1));

  // A record whose bytes were flipped in the server is a miss, and deleted there.
  auto raw = make_redis_store(server.address(), 200).value();
  auto rec = raw->get("r2").value();
  REQUIRE(rec);
  (*rec)[rec->size() - 5] ^= std::byte{1};
  REQUIRE(raw->put("r2", *rec));
  CHECK_FALSE(fresh.load("r2", out));
  CHECK(fresh.stats()[1].corrupt == 1);
  CHECK_FALSE(raw->get("r2").value());

  // The server killed: loads miss (each within the store's 200 ms timeout, or at once
  // during its retry pause) with errors counted, saves count errors.
  server.kill();
  CHECK_FALSE(fresh.load("r9", out));
  CHECK_FALSE(fresh.load("r8", out));
  fresh.save("r3", bytes_of(2048, 3));
  fresh.flush();
  CHECK(fresh.stats()[1].errors >= 2);
  // Back (empty): once the retry pause is over the tier works again. Until then a save is
  // skipped, so it is tried until another client finds it.
  REQUIRE(server.restart());
  kv_tiers third(stores(make_host_store(0), make_redis_store(server.address(), 200).value()));
  CHECK(test::eventually([&] {
    fresh.save("r4", bytes_of(2048, 4));
    fresh.flush();
    return third.load("r4", out);
  }));
  CHECK(out == bytes_of(2048, 4));
}

TEST_CASE("a full redis tier counts refused writes as errors") {
  test::redis_server server(2 << 20);
  REQUIRE_MESSAGE(server.running(), server.skip_reason());
  kv_tiers tiers(stores(make_host_store(0), make_redis_store(server.address(), 200).value()));
  for (int i = 0; i < 16; ++i) tiers.save("f" + std::to_string(i), bytes_of(256 << 10, i));
  tiers.flush();
  const auto s = tiers.stats();
  CHECK(s[1].errors > 0);
  CHECK(s[1].stored > 0);
  CHECK(s[1].stored + s[1].errors + s[1].dropped == 16);
}
