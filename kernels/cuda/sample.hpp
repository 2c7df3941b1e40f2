// sample on the device: one draw per row of logits ([rows][stride], vocab used), each row
// with its own temperature, top-k, top-p, min-p and uniform u in [0, 1); temperature 0
// takes the argmax. CPU reference: kernels/cpu/sample.hpp, whose definition this follows
// (the same candidates, the same order, the same u); only float sums taken in another
// order can move a draw that lands within rounding of a boundary between two tokens. Rows
// keeping more than 2,048 candidates after truncation are drawn in index order instead of
// probability order (the same distribution, another token for the same u).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/sample.hpp"

namespace troupe::cuda {

// Floats of workspace sample needs: the rows' probabilities.
size_t sample_workspace(int32_t rows, int32_t vocab);

// choices: rows entries in device memory; out: rows token ids.
void sample(const float* logits, int64_t stride, int32_t rows, int32_t vocab, const token_choice* choices,
            float* workspace, int32_t* out, cudaStream_t stream);

}  // namespace troupe::cuda
