#include "kernels/cpu/embedding.hpp"

#include <cstring>

#include "kernels/common/assert.hpp"

namespace troupe {

void embedding(const matrix_view& table, const int32_t* tokens, int32_t num_tokens, float* out,
               int64_t out_stride) {
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int32_t id = tokens[t];
    TROUPE_ASSERT(id >= 0 && id < table.rows, id, table.rows);
    float* dst = out + t * out_stride;
    if (table.type == dtype::f32) {
      std::memcpy(dst, static_cast<const float*>(table.data) + id * table.row_stride,
                  sizeof(float) * table.cols);
    } else {
      for (int32_t c = 0; c < table.cols; ++c) dst[c] = table.at(id, c);
    }
  }
}

}  // namespace troupe
