#include "tools/troupe-perf/gpu_bench.hpp"

#include <algorithm>
#include <chrono>

#include "engine/forward/cuda_shard.hpp"
#include "engine/forward/forward_shard.hpp"
#include "engine/sample/rng.hpp"
#include "kernels/cpu/sample.hpp"
#include "tools/common/stats.hpp"

#if defined(TROUPE_HAVE_CUDA)
#include "kernels/cuda/device.hpp"
#endif

namespace troupe::tools {

#if !defined(TROUPE_HAVE_CUDA)
expected<gpu_report> measure_gpu(const model&, const gpu_bench_options& o, const std::vector<int>&, int, int) {
  return error{"device cuda:" + std::to_string(o.device) + ": this build of troupe has no CUDA"};
}
#else
namespace {

// Device-to-device copies of 1 GiB, timed with events: (read + write) bytes per second.
double copy_bandwidth(int runs) {
  const size_t bytes = size_t{1} << 30;
  cuda::buffer<uint8_t> a(bytes), b(bytes);
  a.fill_bytes(1);
  cudaEvent_t start, stop;
  cuda::check(cudaEventCreate(&start), "cudaEventCreate");
  cuda::check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> gbs;
  for (int r = 0; r < runs + 1; ++r) {
    cuda::check(cudaEventRecord(start), "cudaEventRecord");
    cuda::check(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    cuda::check(cudaEventRecord(stop), "cudaEventRecord");
    cuda::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (r > 0) gbs.push_back(2.0 * bytes / (ms / 1e3) / 1e9);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(gbs);
}

// Bytes of weights a decode step reads: every layer matrix and the classifier.
double weight_bytes(const model_config& c, dtype t) {
  const double q = double(c.num_heads) * c.head_dim, kv = double(c.num_kv_heads) * c.head_dim;
  const double per_layer = c.dim * (2 * q + 2 * kv) + 3.0 * c.dim * c.hidden_dim;
  return (per_layer * c.num_layers + double(c.vocab_size) * c.dim) * (t == dtype::f32 ? 4 : 2);
}

}  // namespace

expected<gpu_report> measure_gpu(const model& m, const gpu_bench_options& opt, const std::vector<int>& batches, int tokens,
                                 int runs) {
  const int device = opt.device;
  const std::string& weights = opt.weights;
  if (auto ok = cuda_device_usable(device); !ok) return ok.err();
  gpu_report rep;
  try {
    cuda::check(cudaSetDevice(device), "cudaSetDevice");
    rep.device = cuda::device_name(device);
    rep.copy_gbs = copy_bandwidth(runs);
  } catch (const cuda::cuda_error& e) {
    return error{e.what()};
  }
  const model_config& c = m.config;
  const dtype wt = dtype_named(weights).value();  // (--weights takes only bf16, f16, f32)
  const int32_t prompt = 16;
  const int32_t per_seq = (prompt + tokens + 15) / 16;
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  cuda_shard_options o;
  o.device = device;
  o.weights = wt;
  o.num_blocks = per_seq * max_batch;
  o.max_step_tokens = std::max(prompt * max_batch, max_batch);
  o.graph_max_tokens = opt.graphs ? o.graph_max_tokens : 0;
  o.gemv_max_rows = opt.gemv_rows;
  auto shard = make_cuda_shard(m, shard_spec{}, o);
  if (!shard) return shard.err();
  std::vector<float> hidden, logits;
  std::vector<int32_t> next;
  for (int b : batches) {
    std::vector<std::vector<block_id>> tables(b, std::vector<block_id>(per_seq));
    for (int s = 0; s < b; ++s)
      for (int i = 0; i < per_seq; ++i) tables[s][i] = block_id{static_cast<uint32_t>(s * per_seq + i)};
    std::vector<double> rates;
    for (int r = 0; r < runs + 1; ++r) {
      step_batch sb;
      for (int s = 0; s < b; ++s) {
        std::vector<int32_t> toks(prompt);
        for (int32_t i = 0; i < prompt; ++i) toks[i] = 1 + (s * 131 + i * 17) % (c.vocab_size - 1);
        sb.add(toks, 0, tables[s], true);
      }
      hidden.resize(size_t(sb.num_tokens()) * c.dim);
      logits.resize(size_t(b) * c.vocab_size);
      next.assign(b, 0);
      std::vector<token_choice> choices(b, token_choice{opt.how, 0.0f});
      rng draws(1234);
      sample_scratch scratch;
      // Each step feeds every sequence the token chosen for it the step before: on the
      // device (ids come back), or logits to the host and the choice made there.
      auto step = [&](const step_batch& batch) {
        for (auto& ch : choices) ch.u = draws.uniform();
        if (!opt.logits_to_host && (*shard)->forward_choose(batch, hidden.data(), choices.data(), next.data())) return;
        (*shard)->forward(batch, hidden.data(), logits.data());
        for (int s = 0; s < b; ++s) next[s] = choose(logits.data() + size_t(s) * c.vocab_size, c.vocab_size, choices[s], scratch);
      };
      step(sb);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < tokens; ++i) {
        step_batch d;
        for (int s = 0; s < b; ++s) {
          const std::vector<int32_t> one{next[s]};
          d.add(one, prompt + i, tables[s], true);
        }
        step(d);
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) rates.push_back(double(b) * tokens / secs);
    }
    const double tps = median(rates);
    rep.decode.push_back({b, tps, weight_bytes(c, wt) * (tps / b) / 1e9});
  }
  return rep;
}
#endif

}  // namespace troupe::tools
