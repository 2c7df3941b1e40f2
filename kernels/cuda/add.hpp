// add on the device: x += y, n elements (the residual connections). CPU reference: the
// loop in engine/forward/transformer_shard.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace troupe::cuda {

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream);

}  // namespace troupe::cuda
