#include "engine/model/weights.hpp"

namespace troupe {

int64_t model_weights::streamed_bytes() const {
  int64_t b = classifier.bytes();
  for (const auto& l : layers)
    b += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.w1.bytes() +
         l.w2.bytes() + l.w3.bytes();
  return b;
}

const float* model_weights::dense_vector(dtype type, const void* data, int64_t n) {
  if (type == dtype::f32) return static_cast<const float*>(data);
  auto buf = std::make_unique<float[]>(n);
  const auto view = matrix_view::dense(type, data, 1, static_cast<int32_t>(n));
  for (int64_t i = 0; i < n; ++i) buf[i] = view.at(0, static_cast<int32_t>(i));
  owned.push_back(std::move(buf));
  return owned.back().get();
}

}  // namespace troupe
