#include "engine/forward/shard_push.hpp"

#include <algorithm>
#include <cstdio>

namespace troupe {

shard_push::shard_push(std::string prefix, kv_cache& cache, std::vector<kv_peer> peers, kv_channel_limits limits)
    : prefix_(std::move(prefix)), cache_(cache), limits_(limits), buf_(static_cast<size_t>(cache.block_bytes())) {
  for (kv_peer& p : peers) dests_.push_back(destination{std::move(p), nullptr});
}

shard_push::~shard_push() = default;

kv_channel_sender* shard_push::channel_to(const std::string& replica) {
  auto it = std::find_if(dests_.begin(), dests_.end(), [&](const destination& d) { return d.peer.replica == replica; });
  if (it == dests_.end()) return nullptr;
  destination& d = *it;
  if (d.channel && d.channel->broken().empty()) return d.channel.get();
  const auto now = std::chrono::steady_clock::now();
  if (d.channel || now < d.retry_at) {
    // Broken, or lately unreachable: the replica may be restarting. Tried again after a second.
    if (d.channel) {
      std::fprintf(stderr, "troupe: KV channel to replica %s (%s:%u) broke: %s\n", replica.c_str(), d.peer.host.c_str(),
                   d.peer.port, d.channel->broken().c_str());
      d.channel.reset();
      d.retry_at = now + std::chrono::seconds(1);
    }
    return nullptr;
  }
  auto c = kv_channel_sender::connect(d.peer.host, d.peer.port, limits_);
  if (!c) {
    std::fprintf(stderr, "troupe: no KV channel to replica %s: %s\n", replica.c_str(), c.err().message.c_str());
    d.retry_at = now + std::chrono::seconds(1);
    return nullptr;
  }
  d.channel = std::move(c).value();
  return d.channel.get();
}

void shard_push::push(std::span<const tier_move> pushes, std::span<const request_id> failed) {
  std::vector<kv_channel_sender*> used;
  for (const tier_move& m : pushes) {
    if (std::find(failed.begin(), failed.end(), m.id) != failed.end()) continue;
    kv_channel_sender* ch = channel_to(m.to);
    if (!ch) {
      ++stats_.failed;
      continue;
    }
    cache_.read_block(m.block.value, buf_);
    if (!ch->send(prefix_ + m.key.hex(), buf_)) {
      ++stats_.failed;
      continue;
    }
    if (std::find(used.begin(), used.end(), ch) == used.end()) used.push_back(ch);
    ++stats_.blocks;
    stats_.bytes += buf_.size();
  }
  // Landed before the step answers (a channel that cannot say so in time: its blocks are
  // computed there, if not landed after all).
  for (kv_channel_sender* ch : used)
    if (!ch->flush(flush_timeout)) ++stats_.failed;
}

expected<std::unique_ptr<kv_landing>> kv_landing::start(const std::string& host, uint16_t port, std::string prefix,
                                                        std::shared_ptr<kv_tiers> tiers) {
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
  auto r = kv_channel_receiver::start(host, port, std::move(sink), kv_channel_limits{},
                                      [](const std::string& line) { std::fprintf(stderr, "troupe: KV landing: %s\n", line.c_str()); });
  if (!r) return r.err();
  l->receiver_ = std::move(r).value();
  return l;
}

}  // namespace troupe
