// matrix_view: a non-owning view of a weight matrix W[rows][cols] exactly as a checkpoint
// stores it (mmapped, never converted). y = W x: rows are outputs, cols are inputs.
//
// Dense types (f32, f16, bf16): element (r, c) is at data + r * row_stride + c, in
// elements. q8_0: each row is split into groups of group_size consecutive columns; group
// g of row r holds group_size int8 values at
//   q + r * q_row_stride + g * q_group_stride          (bytes)
// and one scale (f32, or f16 when scale_is_f16) at
//   scale + r * s_row_stride + g * s_group_stride      (bytes)
// which covers both the interleaved GGUF layout ({f16 d; int8 q[32]} blocks) and the
// llama2.c version-2 layout (all int8 values, then all f32 scales). The dequantized
// value is float(q) * scale.
//
// Slicing (for tensor parallelism) narrows rows or columns without copying; a q8_0
// column slice must start on a group boundary.
#pragma once

#include <cstdint>

#include "kernels/common/assert.hpp"
#include "kernels/common/dtype.hpp"

namespace troupe {

struct q8_packed;

struct matrix_view {
  dtype type = dtype::f32;
  int32_t rows = 0;
  int32_t cols = 0;
  // dense types
  const void* data = nullptr;
  int64_t row_stride = 0;  // elements
  // q8_0
  int32_t group_size = 0;
  const int8_t* q = nullptr;
  int64_t q_row_stride = 0;    // bytes
  int64_t q_group_stride = 0;  // bytes
  const uint8_t* scale = nullptr;
  int64_t s_row_stride = 0;    // bytes
  int64_t s_group_stride = 0;  // bytes
  bool scale_is_f16 = false;
  // A copy of a q8_0 matrix repacked for the int8 kernels (kernels/cpu/gemm_w8a8.hpp),
  // owned elsewhere: gemm() then multiplies with int8 activations. Set on a view that is
  // not sliced further.
  const q8_packed* packed = nullptr;

  static matrix_view dense(dtype t, const void* data, int32_t rows, int32_t cols) {
    TROUPE_ASSERT(t != dtype::q8_0);
    matrix_view v;
    v.type = t;
    v.rows = rows;
    v.cols = cols;
    v.data = data;
    v.row_stride = cols;
    return v;
  }

  // Element width of a dense type, in bytes.
  static int dense_bytes(dtype t) { return t == dtype::f32 ? 4 : 2; }

  matrix_view slice_rows(int32_t first, int32_t count) const {
    TROUPE_ASSERT(packed == nullptr, "slice before packing");
    TROUPE_ASSERT(first >= 0 && count >= 0 && first + count <= rows, first, count, rows);
    matrix_view v = *this;
    v.rows = count;
    if (type == dtype::q8_0) {
      v.q = q + first * q_row_stride;
      v.scale = scale + first * s_row_stride;
    } else {
      v.data = static_cast<const uint8_t*>(data) + first * row_stride * dense_bytes(type);
    }
    return v;
  }

  matrix_view slice_cols(int32_t first, int32_t count) const {
    TROUPE_ASSERT(packed == nullptr, "slice before packing");
    TROUPE_ASSERT(first >= 0 && count >= 0 && first + count <= cols, first, count, cols);
    matrix_view v = *this;
    v.cols = count;
    if (type == dtype::q8_0) {
      TROUPE_ASSERT(first % group_size == 0, first, group_size);
      v.q = q + (first / group_size) * q_group_stride;
      v.scale = scale + (first / group_size) * s_group_stride;
    } else {
      v.data = static_cast<const uint8_t*>(data) + first * dense_bytes(type);
    }
    return v;
  }

  float scale_at(int32_t r, int32_t g) const {
    const uint8_t* p = scale + r * s_row_stride + g * s_group_stride;
    if (scale_is_f16) {
      uint16_t h;
      __builtin_memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    float f;
    __builtin_memcpy(&f, p, 4);
    return f;
  }

  // One element, dequantized. For tests and cold paths.
  float at(int32_t r, int32_t c) const {
    switch (type) {
      case dtype::f32:
        return static_cast<const float*>(data)[r * row_stride + c];
      case dtype::f16:
        return f16_to_f32(static_cast<const uint16_t*>(data)[r * row_stride + c]);
      case dtype::bf16:
        return bf16_to_f32(static_cast<const uint16_t*>(data)[r * row_stride + c]);
      case dtype::q8_0: {
        const int32_t g = c / group_size;
        const int8_t v = q[r * q_row_stride + g * q_group_stride + c % group_size];
        return static_cast<float>(v) * scale_at(r, g);
      }
    }
    return 0.0f;
  }

  // Bytes a full pass over the view reads (for bandwidth accounting).
  int64_t bytes() const {
    if (type == dtype::q8_0)
      return int64_t{rows} * cols + int64_t{rows} * (cols / group_size) * (scale_is_f16 ? 2 : 4);
    return int64_t{rows} * cols * dense_bytes(type);
  }
};

}  // namespace troupe
