// cuda_shard: the factory of GPU shards (engine/forward/cuda_transformer_shard.cpp, built
// with the CUDA kernels), and the device checks a tool makes before it asks for one. In a
// build without CUDA every call says so.
#pragma once

#include <memory>
#include <string>

#include "engine/forward/collective.hpp"
#include "engine/forward/forward_shard.hpp"
#include "engine/forward/nccl_group.hpp"
#include "engine/model/model.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

// A GPU shard's settings.
struct cuda_shard_options {
  int device = 0;
  dtype weights = dtype::bf16;   // f32 (exact GEMMs), bf16 or f16 (tensor cores)
  int32_t num_blocks = 1024;     // KV blocks in device memory
  int32_t block_size = 16;
  int32_t max_step_tokens = 512;
  int32_t attention_split = 256; // positions per attention partial
  // Steps of up to graph_max_tokens tokens run as CUDA graphs, one captured per step shape
  // (tokens, attention splits, logit rows) and replayed: one launch instead of a dozen per
  // layer. 0 runs every step kernel by kernel.
  int32_t graph_max_tokens = 256;
  // Steps of up to gemv_max_rows tokens on 16-bit weights run every GEMM as troupe's GEMV
  // (kernels/cuda/gemv.hpp, at most 8), fused with the norms and SiLU; 0: cuBLAS only.
  int32_t gemv_max_rows = 1;
  // How a shard of a tensor-parallel stage (spec.tp.size > 1) sums its partials with its
  // peers': over NCCL in the stage's tp_group (constructing the shard connects its rank
  // and waits for the others, so the ranks' shards must be made on threads of their own),
  // or, without one, through host memory in host_group: each partial copied out, summed
  // by the CPU collective in rank order and copied back (any devices, the same one
  // included; no NCCL, and slow). Tensor-parallel steps run kernel by kernel (no graphs).
  std::shared_ptr<nccl_group> tp_group;
  std::shared_ptr<local_collective_group> host_group;
};

// "cuda:N" -> N; anything else an error.
expected<int> cuda_device_index(const std::string& device);
// Whether device N can run a shard here: an error saying why not (no CUDA in this build,
// no such device).
status cuda_device_usable(int device);

// A shard on a GPU; an error (naming the device) when this build has no CUDA, there is no
// such device, the weights' type is not one a GPU keeps, or a tensor-parallel shard has no
// group (or its rank could not connect).
expected<std::unique_ptr<forward_shard>> make_cuda_shard(const model& m, const shard_spec& spec,
                                                         const cuda_shard_options& o);

}  // namespace troupe
