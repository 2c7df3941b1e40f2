#include "engine/model/weights.hpp"

namespace troupe {

int64_t model_weights::streamed_bytes() const {
  int64_t b = classifier.bytes();
  for (const auto& l : layers)
    b += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.w1.bytes() +
         l.w2.bytes() + l.w3.bytes();
  return b;
}

}  // namespace troupe
