// troupe-perf's subcommands without a model: bandwidth, channel, attention, gemm.
#include <chrono>
#include <cstdio>

#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/gemm_w8a8.hpp"
#include "tools/common/stats.hpp"
#include "tools/troupe-perf/commands.hpp"
#include "tools/troupe-perf/report.hpp"
#include "tools/troupe-perf/triad.hpp"

namespace troupe::tools {

void bandwidth_command::add(CLI::App& app) {
  sub = app.add_subcommand("bandwidth", "memory bandwidth");
  sub->add_option("--mib", mib, "MiB per array (three arrays)")->check(CLI::Range(16, 8192))->capture_default_str();
}

int bandwidth_command::run(const perf_context& c) const {
  thread_pool pool(c.threads);
  auto b = measure_bandwidth(pool, mib << 20, c.runs);
  report("triad bandwidth, " + std::to_string(c.threads) + " threads", b.triad_gbs, "GB/s");
  report("read bandwidth, " + std::to_string(c.threads) + " threads", b.read_gbs, "GB/s");
  return 0;
}

void channel_command::add(CLI::App& app) {
  sub = app.add_subcommand("channel", "the KV channel on loopback beside raw TCP, the same bytes alternated");
  sub->add_option("--mib", o.total_mib, "MiB moved per measurement")->check(CLI::Range(1, 65536))->capture_default_str();
  sub->add_option("--block-kib", o.block_kib, "KiB per record (one KV block)")->check(CLI::Range(1, 65536))->capture_default_str();
}

int channel_command::run(const perf_context& c) const {
  const auto r = measure_channel(o, c.runs);
  char note[64];
  std::snprintf(note, sizeof note, "%.2fx raw TCP (%.2f GB/s)", r.channel_gbs / r.raw_gbs, r.raw_gbs);
  report("kv channel, loopback, " + std::to_string(o.block_kib) + " KiB records", r.channel_gbs, "GB/s", note);
  return 0;
}

void attention_command::add(CLI::App& app) {
  sub = app.add_subcommand("attention", "decode-step attention alone, over a cache scattered in blocks");
  sub->add_option("-b,--sequences", shape.sequences, "sequences, one token each")->check(CLI::Range(1, 4096))->capture_default_str();
  sub->add_option("--context", shape.context, "positions each attends to")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--layers", shape.layers)->check(CLI::Range(1, 1024))->capture_default_str();
  sub->add_option("--heads", shape.heads, "query heads")->check(CLI::Range(1, 1024))->capture_default_str();
  sub->add_option("--kv-heads", shape.kv_heads, "KV heads (dividing --heads)")->check(CLI::Range(1, 1024))->capture_default_str();
  sub->add_option("--head-dim", shape.head_dim)->check(CLI::Range(1, 1024))->capture_default_str();
  sub->add_option("--cache", cache, "the cache's type (q8_0: int8, a scale per token and KV head)")
      ->check(CLI::IsMember({"f32", "f16", "q8_0"}))
      ->capture_default_str();
}

int attention_command::run(const perf_context& c) const {
  if (shape.heads % shape.kv_heads != 0) {
    std::fprintf(stderr, "troupe-perf: --kv-heads %d does not divide --heads %d\n", shape.kv_heads, shape.heads);
    return 1;
  }
  attention_shape s = shape;
  s.cache = dtype_named(cache).value();  // (--cache takes only f32, f16, q8_0)
  const double cache_bytes = 2.0 * s.sequences * s.context * s.layers * s.kv_heads * s.head_dim *
                             (s.cache == dtype::f32 ? 4 : s.cache == dtype::f16 ? 2 : 1);
  if (cache_bytes > 64e9) {
    std::fprintf(stderr, "troupe-perf: that cache would hold %.0f GB; ask for less\n", cache_bytes / 1e9);
    return 1;
  }
  std::fprintf(stderr, "troupe-perf: writing a %.0f MB cache\n", cache_bytes / 1e6);
  thread_pool pool(c.threads);
  const auto a = measure_attention(s, pool, c.runs);
  char note[96];
  std::snprintf(note, sizeof note, "%.2f ms per step of %d layers (%.0f MB read)", a.step_ms, s.layers, a.cache_mb);
  report("attention, " + std::to_string(s.sequences) + " x " + std::to_string(s.context) + " positions, " + cache +
             " cache, " + std::to_string(c.threads) + " threads",
         a.cache_gbs, "GB/s", note);
  return 0;
}

void gemm_command::add(CLI::App& app) {
  sub = app.add_subcommand("gemm", "one GEMM");
  sub->add_option("--type", type)->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}))->capture_default_str();
  sub->add_option("--rows", rows)->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--cols", cols)->check(CLI::Range(32, 1 << 20))->capture_default_str();
  sub->add_option("--tokens", tokens)->check(CLI::Range(1, 4096))->capture_default_str();
  sub->add_option("--copies", copies,
                  "copies of the matrix, taken in turn: enough that together they outgrow the caches reads "
                  "the weights from memory, as a model's forward pass does")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
}

int gemm_command::run(const perf_context& c) const {
  using clock_type = std::chrono::steady_clock;
  const auto seconds_since = [](clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  const dtype dt = dtype_named(type).value();  // (--type takes only these names)
  const int n_cols = cols / 32 * 32;
  const double copy_bytes = double(rows) * n_cols * 4 * copies;
  if (copy_bytes > 16e9) {
    std::fprintf(stderr, "troupe-perf: %d copies would hold %.0f GB; ask for fewer\n", copies, copy_bytes / 1e9);
    return 1;
  }
  // Distinct buffers of the same bytes, and (q8_0) their packed forms, as a shard runs
  // them where the CPU has the int8 kernels.
  std::vector<std::vector<uint8_t>> bufs(copies, std::vector<uint8_t>(int64_t{rows} * n_cols * 4 + 64, 1));
  std::vector<matrix_view> ws(copies);
  std::vector<q8_packed> packed(copies);
  for (int k = 0; k < copies; ++k) {
    matrix_view& w = ws[k];
    if (dt == dtype::q8_0) {
      w.type = dt;
      w.rows = rows;
      w.cols = n_cols;
      w.group_size = 32;
      w.q_row_stride = n_cols / 32 * 34;
      w.q_group_stride = 34;
      w.q = reinterpret_cast<const int8_t*>(bufs[k].data() + 2);
      w.scale = bufs[k].data();
      w.s_row_stride = w.q_row_stride;
      w.s_group_stride = 34;
      w.scale_is_f16 = true;
    } else {
      w = matrix_view::dense(dt, bufs[k].data(), rows, n_cols);
    }
    if (w8a8_kernel_in_use() && w8a8_layout(w)) {
      packed[k] = pack_q8(w);
      w.packed = &packed[k];
    }
  }
  std::vector<float> x(int64_t{tokens} * n_cols, 0.5f), y(int64_t{tokens} * rows);
  thread_pool pool(c.threads);
  std::vector<double> t;
  for (int r = 0; r < c.runs + 1; ++r) {
    auto t0 = clock_type::now();
    int iters = 0;
    do {
      gemm(x.data(), n_cols, tokens, ws[iters % copies], y.data(), rows, pool);
      ++iters;
    } while (seconds_since(t0) < 0.2 || iters < copies);
    if (r > 0) t.push_back(seconds_since(t0) / iters);
  }
  const double s = median(t);
  report("gemm " + type + " " + std::to_string(rows) + "x" + std::to_string(n_cols) + " x " + std::to_string(tokens) +
             " tokens" + (copies > 1 ? ", " + std::to_string(copies) + " copies" : ""),
         2.0 * rows * n_cols * tokens / s / 1e9, "GFLOP/s", std::to_string(ws[0].bytes() / s / 1e9) + " GB/s of weights");
  return 0;
}

}  // namespace troupe::tools
