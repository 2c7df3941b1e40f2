#include "engine/kv/kv_tiers.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstring>

namespace troupe {

std::string_view tier_kind_name(tier_kind k) {
  switch (k) {
    case tier_kind::host: return "host";
    case tier_kind::disk: return "disk";
    case tier_kind::redis: return "redis";
  }
  return "?";
}

std::optional<tier_kind> parse_tier_kind(std::string_view s) {
  for (tier_kind k : {tier_kind::host, tier_kind::disk, tier_kind::redis})
    if (tier_kind_name(k) == s) return k;
  return std::nullopt;
}

std::optional<std::string> validate(const tier_config& c) {
  const std::string who = "a " + std::string(tier_kind_name(c.kind)) + " tier ";
  switch (c.kind) {
    case tier_kind::host:
      break;
    case tier_kind::disk:
      if (c.path.empty()) return who + "needs a path (a directory)";
      break;
    case tier_kind::redis: {
      const auto colon = c.address.rfind(':');
      if (c.address.empty() || colon == std::string::npos || colon == 0 || colon + 1 == c.address.size())
        return who + "needs an address as HOST:PORT, not \"" + c.address + "\"";
      const std::string port = c.address.substr(colon + 1);
      if (!std::all_of(port.begin(), port.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) || port.size() > 5 ||
          std::stoi(port) < 1 || std::stoi(port) > 65535)
        return who + "address \"" + c.address + "\" has no port in 1..65535";
      if (c.timeout_ms < 1 || c.timeout_ms > 60000) return who + "timeout_ms must be in 1..60000";
      break;
    }
  }
  return std::nullopt;
}

namespace {

uint64_t mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

uint64_t chain64(uint64_t h, std::span<const int32_t> tokens, uint64_t k) {
  h = mix64(h ^ (tokens.size() * k));
  for (int32_t t : tokens) h = mix64(h + k * (static_cast<uint32_t>(t) + 1));
  return h;
}

}  // namespace

tier_key tier_key::root(uint64_t ns) {
  return {mix64(ns ^ 0x74726f7570652d6bull), mix64(~ns ^ 0x6b762d7469657273ull)};
}

tier_key tier_key::chain(std::span<const int32_t> block) const {
  // Two chains with different constants, each over both halves of the parent.
  return {chain64(hi ^ mix64(lo), block, 0x9e3779b97f4a7c15ull), chain64(lo ^ mix64(hi + 1), block, 0xd6e8feb86659fd93ull)};
}

std::string tier_key::hex() const {
  static const char digits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = digits[(hi >> (4 * i)) & 15];
    s[31 - i] = digits[(lo >> (4 * i)) & 15];
  }
  return s;
}

namespace {

// checksum64's stripes: four 64-bit lanes over 32 bytes at a time, each adding the product
// of the halves of its word (keyed) and its neighbour's word. Every version computes the
// same sums; the widest the CPU has runs.
alignas(32) constexpr uint64_t stripe_key[4] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull,
                                                0xd6e8feb86659fd93ull};

void stripes_scalar(uint64_t* acc, const std::byte* p, size_t n) {
  for (size_t s = 0; s < n; ++s, p += 32) {
    uint64_t x[4], next[4];
    std::memcpy(x, p, 32);
    for (int j = 0; j < 4; ++j) {
      const uint64_t d = x[j] ^ stripe_key[j];
      next[j] = acc[j] + (d & 0xffffffffu) * (d >> 32) + x[j ^ 1];
    }
    std::memcpy(acc, next, 32);
  }
}

#if defined(__x86_64__)
void stripes_sse2(uint64_t* acc, const std::byte* p, size_t n) {
  __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(acc));
  __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(acc + 2));
  const __m128i k0 = _mm_load_si128(reinterpret_cast<const __m128i*>(stripe_key));
  const __m128i k1 = _mm_load_si128(reinterpret_cast<const __m128i*>(stripe_key + 2));
  for (size_t s = 0; s < n; ++s, p += 32) {
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
    const __m128i d0 = _mm_xor_si128(x0, k0), d1 = _mm_xor_si128(x1, k1);
    a0 = _mm_add_epi64(a0, _mm_add_epi64(_mm_mul_epu32(d0, _mm_srli_epi64(d0, 32)), _mm_shuffle_epi32(x0, _MM_SHUFFLE(1, 0, 3, 2))));
    a1 = _mm_add_epi64(a1, _mm_add_epi64(_mm_mul_epu32(d1, _mm_srli_epi64(d1, 32)), _mm_shuffle_epi32(x1, _MM_SHUFFLE(1, 0, 3, 2))));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(acc), a0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(acc + 2), a1);
}

__attribute__((target("avx2"))) void stripes_avx2(uint64_t* acc, const std::byte* p, size_t n) {
  __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc));
  const __m256i k = _mm256_load_si256(reinterpret_cast<const __m256i*>(stripe_key));
  for (size_t s = 0; s < n; ++s, p += 32) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i d = _mm256_xor_si256(x, k);
    a = _mm256_add_epi64(a, _mm256_add_epi64(_mm256_mul_epu32(d, _mm256_srli_epi64(d, 32)),
                                             _mm256_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2))));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), a);
}
#endif

using stripes_fn = void (*)(uint64_t*, const std::byte*, size_t);

stripes_fn stripes_for(checksum_unit u) {
  switch (u) {
    case checksum_unit::scalar: return stripes_scalar;
#if defined(__x86_64__)
    case checksum_unit::sse2: return stripes_sse2;
    case checksum_unit::avx2: return __builtin_cpu_supports("avx2") ? stripes_avx2 : nullptr;
#else
    default: return nullptr;
#endif
  }
  return nullptr;
}

uint64_t checksum_with(stripes_fn stripes, std::span<const std::byte> bytes, uint64_t seed) {
  uint64_t acc[4];
  for (int j = 0; j < 4; ++j) acc[j] = mix64(seed + static_cast<uint64_t>(j) * 0x9e3779b97f4a7c15ull + bytes.size());
  const size_t n = bytes.size() / 32;
  stripes(acc, bytes.data(), n);
  uint64_t tail = 0;
  for (size_t i = n * 32; i < bytes.size(); ++i) tail = (tail ^ uint64_t{static_cast<uint8_t>(bytes[i])}) * 0x100000001b3ull;
  uint64_t r = tail;
  for (uint64_t a : acc) r = mix64(r ^ a);
  return r;
}

}  // namespace

uint64_t checksum64(std::span<const std::byte> bytes, uint64_t seed) {
  static const stripes_fn widest = [] {
    for (checksum_unit u : {checksum_unit::avx2, checksum_unit::sse2})
      if (stripes_fn f = stripes_for(u)) return f;
    return stripes_for(checksum_unit::scalar);
  }();
  return checksum_with(widest, bytes, seed);
}

std::optional<uint64_t> checksum64_on(checksum_unit u, std::span<const std::byte> bytes, uint64_t seed) {
  const stripes_fn f = stripes_for(u);
  if (!f) return std::nullopt;
  return checksum_with(f, bytes, seed);
}

namespace {

// A record: magic, name length, payload length, checksum, name, payload (little-endian).
constexpr uint32_t record_magic = 0x3242564b;  // "KVB2"; a record of another layout is a miss
constexpr size_t record_header = 4 + 4 + 8 + 8;

template <class T>
void put_le(std::byte* at, T v) {
  std::memcpy(at, &v, sizeof v);
}
template <class T>
T get_le(const std::byte* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

uint64_t record_sum(std::string_view name, std::span<const std::byte> payload) {
  return checksum64(payload, checksum64(std::as_bytes(std::span(name.data(), name.size()))));
}

}  // namespace

std::vector<std::byte> record_head(std::string_view name, std::span<const std::byte> payload) {
  std::vector<std::byte> r(record_header + name.size());
  put_le<uint32_t>(r.data(), record_magic);
  put_le<uint32_t>(r.data() + 4, static_cast<uint32_t>(name.size()));
  put_le<uint64_t>(r.data() + 8, payload.size());
  put_le<uint64_t>(r.data() + 16, record_sum(name, payload));
  std::memcpy(r.data() + record_header, name.data(), name.size());
  return r;
}

std::vector<std::byte> seal_record(std::string_view name, std::span<const std::byte> payload) {
  std::vector<std::byte> r(record_header + name.size() + payload.size());
  put_le<uint32_t>(r.data(), record_magic);
  put_le<uint32_t>(r.data() + 4, static_cast<uint32_t>(name.size()));
  put_le<uint64_t>(r.data() + 8, payload.size());
  put_le<uint64_t>(r.data() + 16, record_sum(name, payload));
  std::memcpy(r.data() + record_header, name.data(), name.size());
  if (!payload.empty()) std::memcpy(r.data() + record_header + name.size(), payload.data(), payload.size());
  return r;
}

std::optional<std::string_view> record_name(std::span<const std::byte> record) {
  if (record.size() < record_header || get_le<uint32_t>(record.data()) != record_magic) return std::nullopt;
  const uint32_t name_len = get_le<uint32_t>(record.data() + 4);
  if (name_len > record.size() - record_header) return std::nullopt;
  return std::string_view(reinterpret_cast<const char*>(record.data() + record_header), name_len);
}

std::optional<std::span<const std::byte>> open_record(std::string_view name, std::span<const std::byte> record) {
  if (record.size() < record_header || get_le<uint32_t>(record.data()) != record_magic) return std::nullopt;
  const uint32_t name_len = get_le<uint32_t>(record.data() + 4);
  const uint64_t len = get_le<uint64_t>(record.data() + 8);
  // (The name first: a record shorter than its name says would make the length below wrap,
  // and a length field that matched the wrapped value would send the reads past the end.)
  if (name_len != name.size() || name_len > record.size() - record_header) return std::nullopt;
  if (len != record.size() - record_header - name_len) return std::nullopt;
  if (std::memcmp(record.data() + record_header, name.data(), name.size()) != 0) return std::nullopt;
  const auto payload = record.subspan(record_header + name_len);
  if (record_sum(name, payload) != get_le<uint64_t>(record.data() + 16)) return std::nullopt;
  return payload;
}

expected<size_t> kv_tier_store::leading_present(std::span<const std::string> names) {
  size_t n = 0;
  for (const std::string& name : names) {
    auto got = get(name);
    if (!got) return got.err();
    if (!*got) break;
    ++n;
  }
  return n;
}

kv_tiers::kv_tiers(std::vector<std::unique_ptr<kv_tier_store>> stores, uint64_t queue_bytes)
    : stores_(std::move(stores)), queue_limit_(queue_bytes), stats_(stores_.size()) {
  if (stores_.size() > 1) writer_ = std::thread([this] { writer_loop(); });
}

kv_tiers::~kv_tiers() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void kv_tiers::save(const std::string& name, std::span<const std::byte> payload) {
  if (stores_.empty()) return;
  auto record = std::make_shared<const std::vector<std::byte>>(seal_record(name, payload));
  const status first = stores_[0]->put(name, *record);
  std::lock_guard lock(mu_);
  if (first) {
    ++stats_[0].stored;
    stats_[0].bytes_in += payload.size();
  } else {
    ++stats_[0].errors;
  }
  for (size_t t = 1; t < stores_.size(); ++t) {
    if (queued_bytes_ + record->size() > queue_limit_) {
      ++stats_[t].dropped;
      continue;
    }
    queued_bytes_ += record->size();
    queue_.push_back(write{name, record, t, payload.size()});
  }
  wake_.notify_one();
}

void kv_tiers::writer_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    write w = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    if (!w.record) {
      --queued_prefetches_;
      lock.unlock();
      std::vector<std::string> one{w.name};
      auto present = stores_[0]->leading_present(one);
      const bool there = present && *present == 1;
      if (!there) fetch(w.name, w.payload_bytes, 1, {});
      lock.lock();
      writing_ = false;
      if (queue_.empty()) idle_.notify_all();
      continue;
    }
    lock.unlock();
    const status st = stores_[w.tier]->put(w.name, *w.record);
    lock.lock();
    writing_ = false;
    queued_bytes_ -= w.record->size();
    tier_stats& s = stats_[w.tier];
    if (st) {
      ++s.stored;
      s.bytes_in += w.payload_bytes;
    } else {
      ++s.errors;
    }
    if (queue_.empty()) idle_.notify_all();
  }
}

void kv_tiers::flush() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return stop_ || (queue_.empty() && !writing_); });
}

bool kv_tiers::load(const std::string& name, std::span<std::byte> out) {
  return fetch(name, out.size(), 0, out);
}

void kv_tiers::prefetch(std::span<const std::string> names, size_t size) {
  if (stores_.size() < 2) return;
  std::lock_guard lock(mu_);
  for (const std::string& name : names) {
    if (queued_prefetches_ >= 4096) break;
    ++queued_prefetches_;
    queue_.push_back(write{name, nullptr, 0, size});
  }
  wake_.notify_one();
}

bool kv_tiers::fetch(const std::string& name, size_t size, size_t from, std::span<std::byte> out) {
  for (size_t t = from; t < stores_.size(); ++t) {
    const auto start = std::chrono::steady_clock::now();
    auto got = stores_[t]->get(name);
    std::optional<std::span<const std::byte>> payload;
    if (got && *got) payload = open_record(name, **got);
    const bool hit = payload && payload->size() == size;
    if (hit && !out.empty()) std::memcpy(out.data(), payload->data(), size);
    // A copy that fails its checks is dropped, so it is written again when recomputed.
    if (got && *got && !hit) stores_[t]->erase(name);
    {
      std::lock_guard lock(mu_);
      tier_stats& s = stats_[t];
      ++s.lookups;
      s.load_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!got) ++s.errors;
      else if (!*got) ++s.misses;
      else if (!hit) ++s.corrupt;
      else {
        ++s.hits;
        s.bytes_out += size;
      }
    }
    if (!hit) continue;
    if (t > 0) {
      // Up into the first tier, for the next time.
      if (stores_[0]->put(name, **got)) {
        std::lock_guard lock(mu_);
        ++stats_[0].stored;
        stats_[0].bytes_in += size;
      }
    }
    return true;
  }
  return false;
}

size_t kv_tiers::leading_present(std::span<const std::string> names) {
  size_t most = 0;
  for (size_t t = 0; t < stores_.size() && most < names.size(); ++t) {
    auto n = stores_[t]->leading_present(names);
    if (!n) {
      std::lock_guard lock(mu_);
      ++stats_[t].errors;
      continue;
    }
    most = std::max(most, *n);
  }
  return most;
}

std::vector<tier_stats> kv_tiers::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

tier_stats& operator+=(tier_stats& a, const tier_stats& b) {
  a.hits += b.hits;
  a.misses += b.misses;
  a.corrupt += b.corrupt;
  a.errors += b.errors;
  a.stored += b.stored;
  a.dropped += b.dropped;
  a.bytes_in += b.bytes_in;
  a.bytes_out += b.bytes_out;
  a.load_seconds += b.load_seconds;
  a.lookups += b.lookups;
  return a;
}

namespace {

void add_by_kind(std::vector<std::pair<tier_kind, tier_stats>>& to, const kv_tiers& t) {
  const auto stats = t.stats();
  for (size_t i = 0; i < stats.size(); ++i) {
    auto it = std::find_if(to.begin(), to.end(), [&](const auto& e) { return e.first == t.kind(i); });
    if (it == to.end()) it = to.insert(to.end(), {t.kind(i), tier_stats{}});
    it->second += stats[i];
  }
}

}  // namespace

void tier_meter::attach(const std::shared_ptr<const kv_tiers>& t) {
  std::lock_guard lock(mu_);
  live_.push_back(t);
  live_at_.push_back(t.get());
}

void tier_meter::retire(const kv_tiers& t) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < live_at_.size(); ++i) {
    if (live_at_[i] != &t) continue;
    add_by_kind(retired_, t);
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
    live_at_.erase(live_at_.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
}

std::vector<std::pair<tier_kind, tier_stats>> tier_meter::totals() const {
  std::lock_guard lock(mu_);
  auto out = retired_;
  for (const auto& w : live_)
    if (auto t = w.lock()) add_by_kind(out, *t);
  return out;
}

}  // namespace troupe
