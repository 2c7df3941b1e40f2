#include <algorithm>
#include "actors/wire/control_codec.hpp"

#include <cmath>

#include <cstring>

#include <capnp/message.h>
#include <kj/exception.h>

#include "actors/wire/frame.hpp"
#include "schema/control.capnp.h"

namespace troupe::wire {

const char* actor_kind_name(actor_kind k) {
  switch (k) {
    case actor_kind::gateway: return "gateway";
    case actor_kind::scheduler: return "scheduler";
    case actor_kind::kv_manager: return "kv-manager";
    case actor_kind::stage: return "stage";
    case actor_kind::shard: return "shard";
    case actor_kind::node_agent: return "node-agent";
    case actor_kind::draft: return "draft";
  }
  return "?";
}

std::vector<uint8_t> encode_node_health(const node_health& h) {
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::NodeHealth>();
  r.setNode(h.node);
  r.setPid(h.pid);
  r.setReady(h.ready);
  auto list = r.initActors(static_cast<unsigned>(h.actors.size()));
  for (size_t i = 0; i < h.actors.size(); ++i) {
    auto a = list[static_cast<unsigned>(i)];
    a.setName(h.actors[i].name);
    a.setKind(static_cast<schema::ActorKind>(h.actors[i].kind));
    a.setAlive(h.actors[i].alive);
    a.setRestarts(h.actors[i].restarts);
  }
  auto tiers = r.initTiers(static_cast<unsigned>(h.tiers.size()));
  for (size_t i = 0; i < h.tiers.size(); ++i) {
    auto t = tiers[static_cast<unsigned>(i)];
    const tier_stats& s = h.tiers[i].stats;
    t.setKind(h.tiers[i].kind);
    t.setHits(s.hits);
    t.setMisses(s.misses);
    t.setCorrupt(s.corrupt);
    t.setErrors(s.errors);
    t.setStored(s.stored);
    t.setDropped(s.dropped);
    t.setBytesIn(s.bytes_in);
    t.setBytesOut(s.bytes_out);
    t.setLoadSeconds(s.load_seconds);
    t.setLookups(s.lookups);
  }
  auto links = r.initLinks(static_cast<unsigned>(h.links.size()));
  for (size_t i = 0; i < h.links.size(); ++i) {
    auto l = links[static_cast<unsigned>(i)];
    const link_counts& c = h.links[i].counts;
    l.setKind(std::string(link_kind_name(h.links[i].kind)));
    l.setRefused(c.refused);
    l.setStalled(c.stalled);
    l.setCrowded(c.crowded);
    l.setLastStallMs(c.last_stall_ms);
  }
  return to_bytes(msg);
}

expected<node_health> decode_node_health(std::span<const uint8_t> bytes) {
  frame_limits lim;
  lim.max_bytes = size_t{1} << 20;
  lim.traversal_words = size_t{1} << 18;
  lim.nesting = 8;
  auto frame = frame_reader::parse(bytes, lim);
  if (!frame) return frame.err();
  try {
    auto r = (*frame)->root<schema::NodeHealth>();
    node_health h;
    h.node = r.getNode().cStr();
    h.pid = r.getPid();
    h.ready = r.getReady();
    for (auto a : r.getActors()) {
      const auto kind = static_cast<uint16_t>(a.getKind());
      if (kind > static_cast<uint16_t>(actor_kind::draft)) return error{"node health: unknown actor kind " + std::to_string(kind)};
      h.actors.push_back({a.getName().cStr(), static_cast<actor_kind>(kind), a.getAlive(), a.getRestarts()});
    }
    for (auto t : r.getTiers()) {
      const std::string kind = t.getKind().cStr();
      if (!parse_tier_kind(kind)) return error{"node health: unknown KV tier kind \"" + kind.substr(0, 16) + "\""};
      tier_stats s;
      s.hits = t.getHits();
      s.misses = t.getMisses();
      s.corrupt = t.getCorrupt();
      s.errors = t.getErrors();
      s.stored = t.getStored();
      s.dropped = t.getDropped();
      s.bytes_in = t.getBytesIn();
      s.bytes_out = t.getBytesOut();
      s.load_seconds = t.getLoadSeconds();
      s.lookups = t.getLookups();
      if (!(s.load_seconds >= 0) || !std::isfinite(s.load_seconds)) return error{"node health: bad KV tier load time"};
      h.tiers.push_back({kind, s});
    }
    for (auto l : r.getLinks()) {
      const std::string kind = l.getKind().cStr();
      const auto known = std::find_if(all_link_kinds.begin(), all_link_kinds.end(),
                                      [&](link_kind k) { return link_kind_name(k) == kind; });
      if (known == all_link_kinds.end()) return error{"node health: unknown link kind \"" + kind.substr(0, 16) + "\""};
      h.links.push_back({*known, {l.getRefused(), l.getStalled(), l.getCrowded(), l.getLastStallMs()}});
    }
    return h;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed node health: ") + e.getDescription().cStr()};
  }
}

std::vector<uint8_t> encode_nccl_invite(const nccl_invite& g) {
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::NcclInvite>();
  r.setNcclId(kj::arrayPtr(reinterpret_cast<const kj::byte*>(g.id.bytes.data()), g.id.bytes.size()));
  r.setSize(static_cast<uint32_t>(g.size));
  r.setRank(static_cast<uint32_t>(g.rank));
  r.setNode(g.node);
  return to_bytes(msg);
}

expected<nccl_invite> decode_nccl_invite(std::span<const uint8_t> bytes) {
  frame_limits lim;
  lim.max_bytes = 4096;
  lim.traversal_words = 1024;
  lim.nesting = 4;
  auto frame = frame_reader::parse(bytes, lim);
  if (!frame) return frame.err();
  try {
    auto r = (*frame)->root<schema::NcclInvite>();
    nccl_invite g;
    auto id = r.getNcclId();
    if (id.size() != g.id.bytes.size())
      return error{"NCCL group: the NCCL id has " + std::to_string(id.size()) + " bytes, not " +
                   std::to_string(g.id.bytes.size())};
    std::memcpy(g.id.bytes.data(), id.begin(), id.size());
    const uint32_t size = r.getSize(), rank = r.getRank();
    if (size < 1 || size > static_cast<uint32_t>(max_nccl_group_size))
      return error{"NCCL group: " + std::to_string(size) + " ranks (1 to " + std::to_string(max_nccl_group_size) +
                   " allowed)"};
    if (rank >= size) return error{"NCCL group: rank " + std::to_string(rank) + " of " + std::to_string(size)};
    g.size = static_cast<int32_t>(size);
    g.rank = static_cast<int32_t>(rank);
    const auto node = r.getNode();
    if (node.size() > 255) return error{"NCCL group: a node name of " + std::to_string(node.size()) + " bytes"};
    g.node = node.cStr();
    return g;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed NCCL invitation: ") + e.getDescription().cStr()};
  }
}

}  // namespace troupe::wire
