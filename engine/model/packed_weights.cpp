#include "engine/model/packed_weights.hpp"

namespace troupe {

const q8_packed& packed_weights::get(const matrix_view& w) {
  std::shared_ptr<entry> e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = entries_[key{w.q, w.scale, w.rows, w.cols}];
    if (!slot) slot = std::make_shared<entry>();
    e = slot;
  }
  std::call_once(e->once, [&] { e->packed = pack_q8(w); });
  return e->packed;
}

}  // namespace troupe
