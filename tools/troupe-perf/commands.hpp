// troupe-perf's subcommands: each adds itself (its options) to the app, and runs when it
// was the one parsed. main.cpp holds the help, the shared options and the dispatch.
//
//   machine_commands.cpp  bandwidth, channel, attention, gemm: no model
//   model_commands.cpp    decode, prefill, batch, eviction, calibrate: a model on the CPU,
//                         and the model loading serve and gpu share
//   serve_command.cpp     serve: the serving loop under concurrent requests
//   gpu_command.cpp       gpu: decode on a GPU shard
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/model/model.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "tools/common/eviction_cli.hpp"
#include "tools/common/speculative_cli.hpp"
#include "tools/troupe-perf/attention_bench.hpp"
#include "tools/troupe-perf/channel_bench.hpp"
#include "tools/troupe-perf/eviction_bench.hpp"

namespace troupe::tools {

// The options every subcommand takes (given before it).
struct perf_context {
  int threads = 0;  // 0 until parsed: all cores
  int runs = 3;
};

// Each returns the process's exit status.

struct bandwidth_command {
  CLI::App* sub = nullptr;
  size_t mib = 512;
  void add(CLI::App& app);
  int run(const perf_context& c) const;
};

struct channel_command {
  CLI::App* sub = nullptr;
  channel_bench_options o;
  void add(CLI::App& app);
  int run(const perf_context& c) const;
};

struct attention_command {
  CLI::App* sub = nullptr;
  attention_shape shape;
  std::string cache = "f16";
  void add(CLI::App& app);
  int run(const perf_context& c) const;
};

struct gemm_command {
  CLI::App* sub = nullptr;
  std::string type = "q8_0";
  int rows = 2048, cols = 768, tokens = 1, copies = 1;
  void add(CLI::App& app);
  int run(const perf_context& c) const;
};

// serve's options (serve_command.cpp).
struct serve_options {
  std::vector<int> concurrency{1, 4, 16, 64};
  int prompt_tokens = 128, output_tokens = 128, requests = 0, shared_prefix = 0, max_step = 512, rounds = 1;
  std::string device = "cpu", weights = "bf16";
};

// gpu's options (gpu_command.cpp).
struct gpu_options {
  int device = 0;
  std::string weights = "bf16";
  std::vector<int> batches{1, 8, 64};
  int tokens = 128;
  std::vector<std::string> graphs{"on"};
  std::vector<int> gemv{1};
  bool logits_to_host = false;
  float temperature = 0.0f, top_p = 1.0f;
  int top_k = 0;
};

// What decode, batch and serve speculate with, and decode and batch evict with.
struct decode_setup {
  speculative_config spec;
  const model* draft = nullptr;
  const speculative_heads* heads = nullptr;
  kv_eviction_config eviction;
};

void add_serve_options(CLI::App& sub, serve_options& o);
int run_serve_command(const model& m, const tokenizer& tok, const serve_options& o, const decode_setup& d,
                      const perf_context& c);
void add_gpu_options(CLI::App& sub, gpu_options& o);
int run_gpu_command(const model& m, const gpu_options& o, const perf_context& c);

// The subcommands that load a model (model_commands.cpp).
struct model_commands {
  CLI::App *decode = nullptr, *prefill = nullptr, *batch = nullptr, *eviction = nullptr, *calibrate = nullptr,
           *serve = nullptr, *gpu = nullptr;
  std::string model_path, tokenizer_path;
  int tokens = 128, prompt_tokens = 128;
  std::vector<int> batches{1, 4, 16, 32};
  speculative_options spec;
  eviction_options evict;
  eviction_bench_options quality;
  std::string profile_path;
  serve_options serving;
  gpu_options device;

  void add(CLI::App& app);
  bool parsed() const;
  int run(const perf_context& c);
};

}  // namespace troupe::tools
