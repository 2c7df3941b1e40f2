// softmax in place over n floats (n >= 1), stable (the maximum is subtracted first),
// with a vectorised exp (simd::exp, within 2 ulp).
#pragma once

#include <cstdint>

namespace troupe {

void softmax(float* x, int32_t n);

}  // namespace troupe
