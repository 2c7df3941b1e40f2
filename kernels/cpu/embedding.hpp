// embedding: out[t] = table[tokens[t]] dequantized to float, for num_tokens tokens.
//   table: [vocab][dim] in any stored dtype; out: [num_tokens][out_stride]
// Token ids must already be validated (< table.rows).
#pragma once

#include <cstdint>

#include "kernels/common/matrix_view.hpp"

namespace troupe {

void embedding(const matrix_view& table, const int32_t* tokens, int32_t num_tokens, float* out,
               int64_t out_stride);

}  // namespace troupe
