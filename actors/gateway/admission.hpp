// admission: the one rule both client endpoints (HTTP and Cap'n Proto) let work in by. Each
// completion a request asks for (each choice of each prompt) counts as one against the
// endpoint's budget; a request asking for more than the whole budget counts as all of it,
// so that it is let in once nothing else is in flight rather than never. Past the budget a
// request is refused at once (HTTP 429, Cap'n Proto OVERLOADED) instead of queueing
// without bound. Thread-safe: every connection's thread admits and releases.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

namespace troupe {

class admission {
 public:
  // `shown`, when given, follows the count in flight too (what /metrics shows; it outlives
  // the admission).
  explicit admission(int32_t budget, std::atomic<int64_t>* shown = nullptr) : budget_(budget < 1 ? 1 : budget), shown_(shown) {}

  // A request's place, given back when the ticket goes (moved, not copied).
  class ticket {
   public:
    ticket() = default;
    ticket(ticket&& o) noexcept : owner_(o.owner_), weight_(o.weight_) { o.owner_ = nullptr; }
    ticket& operator=(ticket&& o) noexcept {
      if (this != &o) {
        release();
        owner_ = o.owner_;
        weight_ = o.weight_;
        o.owner_ = nullptr;
      }
      return *this;
    }
    ticket(const ticket&) = delete;
    ticket& operator=(const ticket&) = delete;
    ~ticket() { release(); }
    void release() {
      if (owner_) {
        owner_->in_flight_.fetch_sub(weight_, std::memory_order_relaxed);
        if (owner_->shown_) owner_->shown_->fetch_sub(weight_, std::memory_order_relaxed);
      }
      owner_ = nullptr;
    }
    int32_t weight() const { return owner_ ? weight_ : 0; }

   private:
    friend class admission;
    ticket(admission* owner, int32_t weight) : owner_(owner), weight_(weight) {}
    admission* owner_ = nullptr;
    int32_t weight_ = 0;
  };

  // Room for `completions` (at least 1) now, or nothing: the endpoint is at capacity.
  std::optional<ticket> admit(int32_t completions) {
    const int32_t weight = completions < 1 ? 1 : completions > budget_ ? budget_ : completions;
    if (in_flight_.fetch_add(weight, std::memory_order_relaxed) + weight > budget_) {
      in_flight_.fetch_sub(weight, std::memory_order_relaxed);
      return std::nullopt;
    }
    if (shown_) shown_->fetch_add(weight, std::memory_order_relaxed);
    return ticket(this, weight);
  }

  int32_t budget() const { return budget_; }
  int32_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

 private:
  const int32_t budget_;
  std::atomic<int32_t> in_flight_{0};
  std::atomic<int64_t>* shown_;
};

}  // namespace troupe
