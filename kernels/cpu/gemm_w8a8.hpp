// gemm_w8a8: y = x W^T for q8_0 weights with int8 activations, the way llama2.c's runq.c
// and llama.cpp compute Q8_0: each token's activations are quantized per group of the
// weights' group size (scale = max |x| / 127, q = x / scale rounded to nearest even),
// each group's products are summed exactly in int32, and the groups are accumulated in
// column order as
//
//   acc = fma(float(isum) * w_scale, x_scale, acc)
//
// Every output element therefore has one value whatever the kernel (Intel AMX tiles,
// AVX-512 VNNI or the scalar loop), the batch, or the split of rows over threads:
// batch-invariant, and identical on every CPU that runs this path.
//
// The weights are repacked once (pack_q8) into blocks of 16 rows whose groups hold four
// consecutive columns of each row together: the operand layout of both VNNI and AMX.
// AMX multiplies 16 tokens by 16 rows per instruction (steps of 5 tokens or more, when the
// CPU has AMX-INT8 and the kernel grants this process tile data); VNNI takes up to eight
// tokens at a time against two row blocks (decode steps, and everything without AMX),
// every pass over a pair of blocks before the next pair, with the activations offset to
// unsigned bytes and the offset's share taken back with each group's weight sum. gemm()
// runs a matrix_view this way when it carries a packed copy.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/common/aligned.hpp"
#include "kernels/common/dtype.hpp"
#include "kernels/common/matrix_view.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

// A q8_0 matrix repacked for the kernels, block by block of 16 rows: first each group's
// int8 values, [group][column / 4][row][4] (512 bytes a group of 32 columns), then every
// group's sixteen scales, [group][row] (padded to 64 bytes), so that a kernel reads two
// streams front to back and each group's values start on a cache line. Compact blocks
// (every scale exact in F16, as GGUF's are) hold the scales as F16, the others as float:
// 544 bytes per 512 values in groups of 32 for compact, as many as GGUF's q8_0 takes.
// Rows past `rows` are zero.
struct q8_packed {
  int32_t rows = 0, cols = 0, group = 0, groups = 0, blocks = 0;
  bool compact = false;
  int64_t block_bytes = 0;  // a block's values and scales
  aligned_vector<int8_t> data;

  // Sets the shape's figures (block_bytes) and makes room for the blocks.
  void lay_out(int32_t rows, int32_t cols, int32_t group, bool compact);
  int32_t scale_bytes() const { return compact ? 2 : 4; }
  int64_t values_bytes() const { return int64_t{group} * 16; }  // one group's values in a block
  // Where group g of block b has its values, and its sixteen scales (F16 or float).
  int64_t tile_offset(int32_t b, int32_t g) const { return b * block_bytes + g * values_bytes(); }
  int64_t scales_offset(int32_t b, int32_t g) const {
    return b * block_bytes + groups * values_bytes() + int64_t{g} * 16 * scale_bytes();
  }
  const int8_t* tile(int32_t b, int32_t g) const { return data.data() + tile_offset(b, g); }
  const void* scales(int32_t b, int32_t g) const { return data.data() + scales_offset(b, g); }
  int8_t at(int32_t r, int32_t c) const {
    const int32_t k = c % group;
    return tile(r / 16, c / group)[(k / 4) * 64 + (r % 16) * 4 + k % 4];
  }
  float scale_at(int32_t r, int32_t g) const {
    const void* s = scales(r / 16, g);
    return compact ? f16_to_f32(static_cast<const uint16_t*>(s)[r % 16]) : static_cast<const float*>(s)[r % 16];
  }
};

// q8_0 weights the packing takes: groups of 32 or 64 columns.
bool w8a8_layout(const matrix_view& w);
q8_packed pack_q8(const matrix_view& w);

// Activations quantized for one GEMM input: [token][cols] int8 and one float scale per
// token and group, [token / 16][group][token % 16] (both zero-padded to a multiple of 16
// tokens, for AMX's 16-token tiles, whose fold reads a group's 16 scales together), and
// the values plus 128 as unsigned bytes for VNNI, by eights of tokens and quads of
// columns, [token / 8][col / 4][token % 8][col % 4], so that the bytes of one column quad
// for a pass's eight tokens lie together (room for a multiple of 8 tokens; the kernels
// read only the tokens there are). A group holding a NaN or an infinity gets a NaN scale
// and zeros, so that its token's outputs are NaN, as they would be in F32.
struct q8_activations {
  static constexpr int interleave = 8;  // tokens side by side in u
  int32_t num_tokens = 0, cols = 0, group = 0, groups = 0;
  aligned_vector<int8_t> q;
  aligned_vector<uint8_t> u;
  aligned_vector<float> scale;

  // Tokens split over `pool`'s threads when one is given.
  void quantize(const float* x, int64_t x_stride, int32_t num_tokens, int32_t cols, int32_t group,
                thread_pool* pool = nullptr);
  int8_t at(int32_t token, int32_t col) const { return q[int64_t{token} * cols + col]; }
  // The unsigned bytes of tokens [t0, t0 + 8), t0 a multiple of 8: column quad j of token
  // t0 + i at [(j * 8 + i) * 4, + 4).
  const uint8_t* quads(int32_t t0) const { return u.data() + int64_t{t0} * cols; }
  uint8_t unsigned_at(int32_t token, int32_t col) const {
    return quads(token - token % interleave)[(col / 4 * interleave + token % interleave) * 4 + col % 4];
  }
  float scale_at(int32_t token, int32_t g) const { return block_scales(token - token % 16, g)[token % 16]; }
  // The scales of group g for tokens [t0, t0 + 16), t0 a multiple of 16.
  const float* block_scales(int32_t t0, int32_t g) const { return scale.data() + (int64_t{t0} * groups + g * 16); }
};

// The CPU has AVX-512 with VNNI, and TROUPE_NO_W8A8 is not set in the environment: q8_0
// weights are worth packing. Decided once per process.
bool vnni_available();
// Besides, the CPU has AMX-INT8, the kernel lets this process use tile data, and
// TROUPE_NO_AMX is not set.
bool amx_available();

enum class w8a8_kernel : uint8_t { scalar, vnni, amx };

// The kernel gemm() runs packed q8_0 weights with, decided once per process: amx where
// amx_available(), else vnni where vnni_available(); on a CPU without VNNI, scalar where
// TROUPE_W8A8=scalar is set in the environment (the definition itself: the same bits,
// many times slower; it lets a machine without VNNI check int8-activation output against
// a W8A8 reference); none where q8_0 weights keep float activations.
std::optional<w8a8_kernel> w8a8_kernel_in_use();

// Rows [row_begin, row_end) of y for activations `a` (quantized with w's group size):
// y[t][r] for every token t, with kernel `k` (amx: AMX tiles where the step is long
// enough, VNNI for the rest; vnni needs vnni_available(), amx amx_available()). The
// results are the same bits whichever kernel runs. The kernels ask for the weights of
// rows up to fetch_end ahead of their turn: the rows the caller takes next on this thread
// (row_end or less: none past the range).
void gemm_w8a8_rows(const q8_activations& a, const q8_packed& w, int32_t row_begin, int32_t row_end, float* y,
                    int64_t y_stride, w8a8_kernel k, int32_t fetch_end = 0);

}  // namespace troupe
