#include "engine/forward/shard_tiers.hpp"

#include <algorithm>
#include <cstring>

namespace troupe {

namespace {

// Bytes of a matrix's first row (at most `cap`), as stored.
std::span<const std::byte> first_row(const matrix_view& m, size_t cap) {
  if (m.type == dtype::q8_0 && m.q) return {reinterpret_cast<const std::byte*>(m.q), std::min<size_t>(cap, m.cols)};
  if (!m.data) return {};
  const size_t elem = m.type == dtype::f32 ? 4 : 2;
  return {static_cast<const std::byte*>(m.data), std::min<size_t>(cap, elem * static_cast<size_t>(m.cols))};
}

std::span<const std::byte> floats(const float* p, int32_t n) {
  if (!p) return {};
  return {reinterpret_cast<const std::byte*>(p), sizeof(float) * static_cast<size_t>(n)};
}

std::string hex16(uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 0; i < 16; ++i) s[15 - i] = digits[(v >> (4 * i)) & 15];
  return s;
}

}  // namespace

std::string tier_prefix(const model& m, const shard_spec& spec, const kv_cache_shape& shape) {
  const model_config& c = m.config;
  const int32_t end = spec.end_layer == 0 ? c.num_layers : spec.end_layer;
  const int64_t shape_fields[] = {c.dim, c.hidden_dim, c.num_layers, c.num_heads, c.num_kv_heads, c.vocab_size,
                                  c.head_dim, c.rope_dim, static_cast<int64_t>(c.rope), static_cast<int64_t>(c.family),
                                  c.qkv_bias, c.sliding_window};
  uint64_t h = checksum64(std::as_bytes(std::span(shape_fields)));
  const float scalars[] = {c.rope_base, c.rms_eps};
  h = checksum64(std::as_bytes(std::span(scalars)), h);
  h = checksum64(std::as_bytes(std::span(c.rope_freq_factors)), h);
  h = checksum64(first_row(m.weights.token_embedding, 4096), h);
  for (int32_t l = 0; l < end && l < static_cast<int32_t>(m.weights.layers.size()); ++l) {
    const layer_weights& w = m.weights.layers[static_cast<size_t>(l)];
    h = checksum64(floats(w.attn_norm, c.dim), h);
    h = checksum64(first_row(w.wk, 4096), h);
    h = checksum64(first_row(w.wv, 4096), h);
    h = checksum64(floats(w.ffn_norm, c.dim), h);
  }
  return hex16(h) + "/L" + std::to_string(spec.first_layer) + "-" + std::to_string(end) + "/tp" +
         std::to_string(spec.tp.rank) + "of" + std::to_string(spec.tp.size) + "/" + std::string(dtype_name(shape.type)) +
         "/b" + std::to_string(shape.block_size) + "/";
}

size_t tier_directory_blocks(const kv_config& kv, const model_config& c, dtype kv_type) {
  kv_cache_shape whole;
  whole.num_layers = c.num_layers;
  whole.num_blocks = 1;
  whole.num_kv_heads = c.num_kv_heads;
  whole.block_size = kv.block_size;
  whole.head_dim = c.head_dim;
  whole.type = kv_type;
  const auto block = static_cast<uint64_t>(std::max<int64_t>(1, kv_cache::block_bytes(whole)));
  uint64_t n = 0;
  // (Every block goes to every tier: they hold as many as the largest.)
  for (const tier_config& t : kv.tiers) n = std::max(n, (t.capacity_bytes ? t.capacity_bytes : default_tier_capacity) / block);
  return static_cast<size_t>(std::clamp<uint64_t>(n, 1, uint64_t{1} << 24));
}

std::string tier_scope(const std::string& prefix) {
  std::string s = prefix;
  while (!s.empty() && s.back() == '/') s.pop_back();
  std::replace(s.begin(), s.end(), '/', '-');
  return s;
}

expected<std::unique_ptr<kv_tiers>> open_tiers(const std::vector<tier_config>& cfg, const std::string& prefix) {
  std::vector<std::unique_ptr<kv_tier_store>> stores;
  for (const tier_config& t : cfg) {
    auto s = make_tier_store(t, tier_scope(prefix));
    if (!s) return error{"KV tier " + std::to_string(stores.size() + 1) + " (" + std::string(tier_kind_name(t.kind)) +
                         "): " + s.err().message};
    stores.push_back(std::move(s).value());
  }
  return std::make_unique<kv_tiers>(std::move(stores));
}

expected<std::unique_ptr<shard_tiers>> shard_tiers::open(const std::vector<tier_config>& cfg, const model& m,
                                                         const shard_spec& spec, kv_cache& cache,
                                                         std::shared_ptr<tier_meter> meter) {
  const std::string prefix = tier_prefix(m, spec, cache.shape());
  auto tiers = open_tiers(cfg, prefix);
  if (!tiers) return tiers.err();
  return std::make_unique<shard_tiers>(std::shared_ptr<kv_tiers>(std::move(tiers).value()), prefix, cache,
                                       std::move(meter));
}

shard_tiers::shard_tiers(std::shared_ptr<kv_tiers> tiers, std::string prefix, kv_cache& cache,
                         std::shared_ptr<tier_meter> meter)
    : tiers_(std::move(tiers)), meter_(std::move(meter)), prefix_(std::move(prefix)), cache_(cache),
      buf_(static_cast<size_t>(cache.block_bytes())) {
  if (meter_) meter_->attach(tiers_);
}

shard_tiers::~shard_tiers() {
  if (meter_) meter_->retire(*tiers_);
}

std::vector<request_id> shard_tiers::load(std::span<const tier_move> loads) {
  std::vector<request_id> failed;
  for (const tier_move& l : loads) {
    if (std::find(failed.begin(), failed.end(), l.id) != failed.end()) continue;
    if (tiers_->load(prefix_ + l.key.hex(), buf_))
      cache_.write_block(l.block.value, buf_);
    else
      failed.push_back(l.id);
  }
  return failed;
}

void shard_tiers::prefetch(std::span<const tier_key> keys) {
  if (keys.empty()) return;
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (const tier_key& k : keys) names.push_back(prefix_ + k.hex());
  tiers_->prefetch(names, buf_.size());
}

size_t shard_tiers::probe(std::span<const tier_key> keys) {
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (const tier_key& k : keys) names.push_back(prefix_ + k.hex());
  return tiers_->leading_present(names);
}

void shard_tiers::save(std::span<const tier_move> saves, std::span<const request_id> failed) {
  for (const tier_move& s : saves) {
    if (std::find(failed.begin(), failed.end(), s.id) != failed.end()) continue;
    cache_.read_block(s.block.value, buf_);
    tiers_->save(prefix_ + s.key.hex(), buf_);
  }
}

}  // namespace troupe
