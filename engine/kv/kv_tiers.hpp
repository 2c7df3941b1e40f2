// kv_tiers: KV blocks below the pool. A cached prefix block whose KV a shard has computed is
// copied down into the tiers (host memory, a local directory, a Redis or Valkey server),
// so that when the pool has reused its block, a later prompt with the same prefix loads it
// back instead of computing it again.
//
// Blocks are named by content: a shard's key prefix (its model, layer range, tensor-parallel
// slice, cache type and block size: tier_prefix()) and the 128-bit chained hash of the
// tokens up to the block's end (tier_key, which the scheduler computes, per namespace). So
// replicas of one model share a remote tier, and a restarted one finds its prefixes there.
//
// Every stored block is a record (seal_record): a magic number, its name, its length and a
// checksum over both. A record that is missing, truncated, corrupt, or names another key is
// a miss: the block is computed again, never decoded from garbage.
//
// Writes are write-through: the first tier (host memory, usually) at once, the others by a
// background thread with a bounded queue (writes that do not fit are dropped, and counted).
// A load tries the tiers in order; a hit on a lower tier is copied into the first. The same
// thread prefetches: it reads blocks a later load will want up into the first tier. A store
// that fails (a server gone, a full disk) counts the error and reads as a miss; a Redis
// tier that failed waits a second before it tries to connect again, so a store that is
// away costs a step nothing but the check.
//
// Thread-safe: a shard's thread loads and saves, the writer thread writes the lower tiers.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/kv/tier_types.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

// A 64-bit checksum of bytes (every bit of the input reaches every bit of the result), at
// tens of GB/s with SSE2 or AVX2, the widest the CPU has.
uint64_t checksum64(std::span<const std::byte> bytes, uint64_t seed = 0);
// The same sums by one unit (nullopt where the CPU lacks it), for tests.
enum class checksum_unit : uint8_t { scalar, sse2, avx2 };
std::optional<uint64_t> checksum64_on(checksum_unit u, std::span<const std::byte> bytes, uint64_t seed = 0);

std::vector<std::byte> seal_record(std::string_view name, std::span<const std::byte> payload);
// A record's bytes before its payload (seal_record is this, then the payload): for writing
// a record without copying its payload.
std::vector<std::byte> record_head(std::string_view name, std::span<const std::byte> payload);
// The payload of an intact record of `name`, or nullopt (truncated, corrupt, another name).
std::optional<std::span<const std::byte>> open_record(std::string_view name, std::span<const std::byte> record);
// The name a record says it holds (unchecked: open_record checks it), or nullopt when even
// its header is cut.
std::optional<std::string_view> record_name(std::span<const std::byte> record);

struct tier_stats {
  uint64_t hits = 0;       // blocks loaded from this tier
  uint64_t misses = 0;     // looked up here and absent
  uint64_t corrupt = 0;    // present but failing the record's checks (dropped, recomputed)
  uint64_t errors = 0;     // the store failed (unreachable, timed out, disk full)
  uint64_t stored = 0;     // blocks written
  uint64_t dropped = 0;    // writes dropped: the background queue was full
  uint64_t bytes_in = 0;   // written to it
  uint64_t bytes_out = 0;  // loaded from it
  double load_seconds = 0; // spent in its lookups, hits or not
  uint64_t lookups = 0;
};

tier_stats& operator+=(tier_stats& a, const tier_stats& b);

// One tier's storage of records by name.
class kv_tier_store {
 public:
  virtual ~kv_tier_store() = default;
  virtual tier_kind kind() const = 0;
  // Stores the record under `name`, replacing any; an error if the store failed.
  virtual status put(const std::string& name, std::span<const std::byte> record) = 0;
  // The record under `name`, nullopt if there is none; an error if the store failed.
  virtual expected<std::optional<std::vector<std::byte>>> get(const std::string& name) = 0;
  virtual void erase(const std::string& name) = 0;
  // How many of `names`, from the first, it holds (a Redis tier asks in one round trip).
  virtual expected<size_t> leading_present(std::span<const std::string> names);
};

std::unique_ptr<kv_tier_store> make_host_store(uint64_t capacity_bytes);
// A directory's records (in `scope`, a subdirectory, when given: each shard's own, so that
// its capacity counts its files alone); a directory that cannot be made or written is an
// error now, not at the first write.
expected<std::unique_ptr<kv_tier_store>> make_disk_store(const std::string& dir, uint64_t capacity_bytes,
                                                         const std::string& scope = "");
expected<std::unique_ptr<kv_tier_store>> make_redis_store(const std::string& address, int32_t timeout_ms);
expected<std::unique_ptr<kv_tier_store>> make_tier_store(const tier_config& c, const std::string& scope = "");

class kv_tiers {
 public:
  // Stores in order, the first the fastest; queue_bytes bounds the background writes.
  explicit kv_tiers(std::vector<std::unique_ptr<kv_tier_store>> stores, uint64_t queue_bytes = uint64_t{256} << 20);
  ~kv_tiers();  // the queued writes are dropped
  kv_tiers(const kv_tiers&) = delete;
  kv_tiers& operator=(const kv_tiers&) = delete;

  // Copies a block's bytes down: the first tier now, the others in the background.
  void save(const std::string& name, std::span<const std::byte> payload);
  // Fills `out` with the block's bytes from the first tier that holds an intact copy of
  // exactly that size; false if none does (out is then unspecified).
  bool load(const std::string& name, std::span<std::byte> out);
  // In the background: blocks of `size` bytes the first tier lacks are looked up in the
  // others and copied into it, so that a later load finds them there (a waiting request's
  // prefix, read while other steps compute). Lookups past a bounded queue are dropped.
  void prefetch(std::span<const std::string> names, size_t size);
  // How many of `names`, from the first, some tier holds (a restarted scheduler's view of
  // what the tiers kept; the loads check the records).
  size_t leading_present(std::span<const std::string> names);
  // Waits until the background writes queued so far are done (tests, shutdown drains).
  void flush();

  size_t size() const { return stores_.size(); }
  tier_kind kind(size_t i) const { return stores_[i]->kind(); }
  std::vector<tier_stats> stats() const;

 private:
  // A background job: a record written to a tier, or (without one) a block prefetched.
  struct write {
    std::string name;
    std::shared_ptr<const std::vector<std::byte>> record;
    size_t tier;
    uint64_t payload_bytes;
  };
  void writer_loop();
  // Looks `name` up from tier `from` on, counting each lookup in its tier's figures; an
  // intact record of a `size`-byte block found below the first tier is copied into it.
  // `out` (if not empty) gets the block's bytes.
  bool fetch(const std::string& name, size_t size, size_t from, std::span<std::byte> out);

  std::vector<std::unique_ptr<kv_tier_store>> stores_;
  uint64_t queue_limit_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable wake_, idle_;
  std::deque<write> queue_;
  uint64_t queued_bytes_ = 0;
  size_t queued_prefetches_ = 0;
  bool writing_ = false;
  bool stop_ = false;
  std::vector<tier_stats> stats_;
  std::thread writer_;
};

// A process's KV-tier figures, summed by kind over its shards' tiers (a node's /metrics
// figures): those alive now, and those of shards that have ended. Thread-safe.
class tier_meter {
 public:
  void attach(const std::shared_ptr<const kv_tiers>& t);
  void retire(const kv_tiers& t);  // its figures stay counted; it is no longer looked at
  std::vector<std::pair<tier_kind, tier_stats>> totals() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::weak_ptr<const kv_tiers>> live_;
  std::vector<const kv_tiers*> live_at_;
  std::vector<std::pair<tier_kind, tier_stats>> retired_;
};

}  // namespace troupe
