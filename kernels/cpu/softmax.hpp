// softmax in place over n floats (n >= 1), stable (the maximum is subtracted first).
#pragma once

#include <cstdint>

namespace troupe {

void softmax(float* x, int32_t n);

}  // namespace troupe
