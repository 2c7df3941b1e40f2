// shard_tiers: a CPU shard's side of the KV tiers (engine/kv/kv_tiers.hpp). A step's plan
// names the blocks to load before it runs and those to copy down after; this fills and
// reads the shard's cache for them, under names that hold the shard's own part of a block:
//
//   <model fingerprint>/L<first>-<end>/tp<rank>of<n>/<cache type>/b<block size>/<key>
//
// The fingerprint covers the model's shape and a sample of the weights the KV of the
// shard's layers depends on (the embedding, and every layer's norms, K and V projections
// up to its last), so another checkpoint of the same shape never reads these blocks. The
// tokenizer is not in it: KV is a function of token ids and weights alone.
//
// One thread at a time (the shard's).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/forward/forward_shard.hpp"
#include "engine/forward/kv_cache.hpp"
#include "engine/kv/kv_config.hpp"
#include "engine/kv/kv_tiers.hpp"
#include "engine/model/model.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

std::string tier_prefix(const model& m, const shard_spec& spec, const kv_cache_shape& shape);
// The subdirectory of a disk tier that holds the blocks of names under `prefix`.
std::string tier_scope(const std::string& prefix);

// The tiers `cfg` names, as a shard with names under `prefix` (or a scheduler looking up
// that shard's blocks) sees them; an error names the tier that cannot be opened.
expected<std::unique_ptr<kv_tiers>> open_tiers(const std::vector<tier_config>& cfg, const std::string& prefix);

// How many blocks the scheduler's tier directory should remember for `kv`'s tiers: their
// capacities over a whole block's bytes (every layer; a Redis tier counted at its
// capacity_bytes, or the default), so that what it believes held mostly is.
size_t tier_directory_blocks(const kv_config& kv, const model_config& c, dtype kv_type);

class shard_tiers {
 public:
  // The tiers `cfg` names, for a shard of m with this spec and cache; an error names the
  // tier that cannot be opened (a directory that cannot be made; an address that is not
  // HOST:PORT). A Redis server need not be up yet.
  // Its figures join `meter`'s, if given (a node's).
  static expected<std::unique_ptr<shard_tiers>> open(const std::vector<tier_config>& cfg, const model& m,
                                                     const shard_spec& spec, kv_cache& cache,
                                                     std::shared_ptr<tier_meter> meter = nullptr);
  shard_tiers(std::shared_ptr<kv_tiers> tiers, std::string prefix, kv_cache& cache,
              std::shared_ptr<tier_meter> meter = nullptr);
  ~shard_tiers();
  shard_tiers(const shard_tiers&) = delete;
  shard_tiers& operator=(const shard_tiers&) = delete;

  // Fills the blocks of `loads`; returns the requests one of whose blocks no tier held
  // intact (their steps must not be used).
  std::vector<request_id> load(std::span<const tier_move> loads);
  // Copies the blocks of `saves` down, but for those of the `failed` requests.
  void save(std::span<const tier_move> saves, std::span<const request_id> failed);

  // Reads these blocks up into the first tier in the background (kv_tiers::prefetch).
  void prefetch(std::span<const tier_key> keys);
  // How many of `keys`, from the first, some tier holds for this shard.
  size_t probe(std::span<const tier_key> keys);

  kv_tiers& tiers() { return *tiers_; }
  std::shared_ptr<kv_tiers> shared_tiers() const { return tiers_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::shared_ptr<kv_tiers> tiers_;
  std::shared_ptr<tier_meter> meter_;
  std::string prefix_;
  kv_cache& cache_;
  std::vector<std::byte> buf_;
};

}  // namespace troupe
