// link_meter: what a node's own listeners (step links, KV channels) saw of the peers that
// connected to them, for its health report and /metrics: connections refused (a failed
// handshake, a frame that breaks the format), frames not whole by their deadline (a peer
// that stalled or trickled in the middle of one), and newcomers' handshakes cut short to
// make room for others. One per node process, shared by its listeners; any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace troupe {

enum class link_kind : uint8_t { step, kv };
inline constexpr std::array<link_kind, 2> all_link_kinds{link_kind::step, link_kind::kv};
inline std::string_view link_kind_name(link_kind k) { return k == link_kind::step ? "step" : "kv"; }

struct link_counts {
  uint64_t refused = 0;  // connections closed for a failed handshake or a broken frame
  uint64_t stalled = 0;  // connections closed for a frame not whole by its deadline
  uint64_t crowded = 0;  // handshakes cut short for a newcomer (every slot was taken)
  int64_t last_stall_ms = 0;  // when the latest stall was noticed (ms since the epoch; 0: never)
};

class link_meter {
 public:
  void refused(link_kind k) { at(k).refused.fetch_add(1, std::memory_order_relaxed); }
  void crowded(link_kind k) { at(k).crowded.fetch_add(1, std::memory_order_relaxed); }
  void stalled(link_kind k) {
    at(k).stalled.fetch_add(1, std::memory_order_relaxed);
    const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
    at(k).last_stall_ms.store(now.count(), std::memory_order_relaxed);
  }
  link_counts counts(link_kind k) const {
    const slot& s = at(k);
    return {s.refused.load(std::memory_order_relaxed), s.stalled.load(std::memory_order_relaxed),
            s.crowded.load(std::memory_order_relaxed), s.last_stall_ms.load(std::memory_order_relaxed)};
  }

 private:
  struct slot {
    std::atomic<uint64_t> refused{0}, stalled{0}, crowded{0};
    std::atomic<int64_t> last_stall_ms{0};
  };
  slot& at(link_kind k) { return slots_[static_cast<size_t>(k)]; }
  const slot& at(link_kind k) const { return slots_[static_cast<size_t>(k)]; }
  std::array<slot, all_link_kinds.size()> slots_;
};

}  // namespace troupe
