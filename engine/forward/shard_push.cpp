#include "engine/forward/shard_push.hpp"

#include <algorithm>
#include <cstdio>

namespace troupe {

shard_push::shard_push(std::string prefix, kv_cache& cache, std::vector<kv_peer> peers, kv_channel_limits limits)
    : prefix_(std::move(prefix)), cache_(cache), limits_(limits), buf_(static_cast<size_t>(cache.block_bytes())) {
  for (kv_peer& p : peers) dests_.push_back(destination{std::move(p), nullptr});
}

shard_push::~shard_push() = default;

// A destination that failed is left alone for a while: a second, doubling to 30 while it
// keeps failing (each connect to a host that does not answer can take 2 s of a step).
void shard_push::back_off(destination& d, std::chrono::steady_clock::time_point now) {
  d.channel.reset();
  d.retry_at = now + d.backoff;
  d.backoff = std::min<std::chrono::seconds>(d.backoff * 2, std::chrono::seconds(30));
}

shard_push::destination* shard_push::channel_to(const std::string& replica) {
  auto it = std::find_if(dests_.begin(), dests_.end(), [&](const destination& d) { return d.peer.replica == replica; });
  if (it == dests_.end()) return nullptr;
  destination& d = *it;
  if (d.channel && d.channel->broken().empty()) return &d;
  const auto now = std::chrono::steady_clock::now();
  if (d.channel || now < d.retry_at) {
    // Broken, or lately unreachable: the replica may be restarting. Tried again later.
    if (d.channel) {
      std::fprintf(stderr, "troupe: KV channel to replica %s (%s:%u) broke: %s\n", replica.c_str(), d.peer.host.c_str(),
                   d.peer.port, d.channel->broken().c_str());
      back_off(d, now);
    }
    return nullptr;
  }
  auto c = kv_channel_sender::connect(d.peer.host, d.peer.port, limits_);
  if (!c) {
    std::fprintf(stderr, "troupe: no KV channel to replica %s: %s\n", replica.c_str(), c.err().message.c_str());
    back_off(d, now);
    return nullptr;
  }
  d.channel = std::move(c).value();
  return &d;
}

void shard_push::push(std::span<const tier_move> pushes, std::span<const request_id> failed) {
  std::vector<destination*> used;
  for (const tier_move& m : pushes) {
    if (std::find(failed.begin(), failed.end(), m.id) != failed.end()) continue;
    destination* d = channel_to(m.to);
    if (!d) {
      ++stats_.failed;
      continue;
    }
    cache_.read_block(m.block.value, buf_);
    if (!d->channel->send(prefix_ + m.key.hex(), buf_)) {
      ++stats_.failed;
      continue;
    }
    if (std::find(used.begin(), used.end(), d) == used.end()) used.push_back(d);
    ++stats_.blocks;
    stats_.bytes += buf_.size();
  }
  // Landed before the step answers. A receiver that cannot say so in time (a hung node) is
  // left alone for a while, so that it costs the steps after this one nothing; blocks that
  // did not land are computed there.
  for (destination* d : used) {
    if (!d->channel) continue;  // it broke after its first blocks: left alone already
    if (d->channel->flush(flush_timeout)) {
      d->backoff = std::chrono::seconds(1);
      continue;
    }
    ++stats_.failed;
    std::fprintf(stderr, "troupe: KV channel to replica %s (%s:%u): no acknowledgement within %lld ms\n",
                 d->peer.replica.c_str(), d->peer.host.c_str(), d->peer.port, static_cast<long long>(flush_timeout.count()));
    back_off(*d, std::chrono::steady_clock::now());
  }
}

expected<std::unique_ptr<kv_landing>> kv_landing::start(const std::string& host, uint16_t port, std::string prefix,
                                                        std::shared_ptr<kv_tiers> tiers, std::shared_ptr<link_meter> meter) {
  std::unique_ptr<kv_landing> l(new kv_landing());
  l->tiers_ = tiers;
  auto foreign = l->foreign_;
  auto sink = [tiers, foreign, prefix = std::move(prefix)](std::string_view name, std::span<const std::byte> payload) {
    if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) {
      foreign->fetch_add(1);
      return;
    }
    tiers->save(std::string(name), payload);
  };
  kv_channel_limits limits;
  limits.max_connections = 256;  // one from each prefill shard of its layers
  auto r = kv_channel_receiver::start(
      host, port, std::move(sink), limits,
      [](const std::string& line) { std::fprintf(stderr, "troupe: KV landing: %s\n", line.c_str()); }, process_link_guard(),
      std::move(meter));
  if (!r) return r.err();
  l->receiver_ = std::move(r).value();
  return l;
}

}  // namespace troupe
