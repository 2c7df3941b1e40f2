// cuda_transformer_shard: the forward pass of transformer_shard, step for step, on a GPU:
// the same layer loop over the CUDA kernels (kernels/cuda/) and cuBLAS. Weights go to
// device memory once, at construction: f32, or bf16/f16 for the tensor cores (Q8_0 and
// 16-bit checkpoints are dequantized on the host first). The KV cache lives in device
// memory in the CPU's block layout. Hidden states and logits cross to the host at the
// shard's edges only (hidden states not even there over a device link, below).
//
// Per layer: Q, K and V come from one GEMM over the stacked wq/wk/wv, gate and up from one
// over w1/w3; one launch turns the Q and K heads of that output and writes K and V to the
// cache, and attention (the tiled prefill kernel for steps with prompt chunks, the split
// kernel otherwise) reads Q from it in place; the output and down projections add into
// the residual stream inside their GEMMs. Steps of more than gemv_max_rows tokens (and FP32
// weights) run cuBLAS on inputs the norm and SiLU kernels write in the weights' type;
// smaller steps run troupe's GEMV, which computes those inputs itself: six launches a
// layer. Steps up to graph_max_tokens tokens replay a CUDA graph captured for their shape.
//
// A tensor-parallel shard (Megatron split, as on the CPU: tp_slice.hpp) keeps its slice of
// each matrix: its query and KV heads' rows of wq/wk/wv, their columns of wo, its FFN
// columns' rows of w1/w3 and columns of w2, and the KV cache of its KV heads. The output
// and down projections are partial sums: rank 0 adds its own into the residual stream,
// the others write theirs in its place, and an all-reduce over the stage's ranks (NCCL,
// or staged through host memory) leaves every rank with the residual plus all the
// partials. Rank 0 alone runs the head.
//
// KV eviction (cuda_shard_eviction.hpp): compactions run before a step's layers, and a
// step whose sequences ask for attention sums adds each layer's to them after its
// attention, then brings them back.
//
// Between neighbouring GPU stages a device link (nccl_group.hpp) carries the hidden states
// over NCCL instead of through the host: the earlier stage's rank 0 queues a send to every
// rank of the next and answers once its computation is done, without waiting for the send
// (the receivers post theirs only when the step reaches them); the next step's work queues
// behind it.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <map>
#include <thread>
#include <tuple>
#include <utility>

#include "engine/forward/collective.hpp"
#include "engine/forward/cuda_shard_eviction.hpp"
#include "engine/forward/cuda_shard_parts.hpp"
#include "engine/forward/cuda_shard.hpp"
#include "engine/forward/forward_shard.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cuda/sample.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/gemv.hpp"
#include "kernels/cuda/paged_attention.hpp"
#include "kernels/cuda/prefill_attention.hpp"
#include "kernels/cuda/rmsnorm.hpp"
#include "kernels/cuda/rope.hpp"
#include "kernels/cuda/silu_mul.hpp"

namespace troupe {

namespace {

class cuda_transformer_shard final : public forward_shard {
 public:
  cuda_transformer_shard(const model& m, const shard_spec& spec, const cuda_shard_options& o)
      : cfg_(m.config), spec_(spec), opt_(o) {
    if (spec_.end_layer == 0) spec_.end_layer = cfg_.num_layers;
    cuda::check(cudaSetDevice(o.device), "cudaSetDevice");
    cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    gemm_ = std::make_unique<cuda::gemm_engine>(stream_);
    gemm_->set_gemv_rows(o.gemv_max_rows);
    const int32_t hd = cfg_.head_dim;
    const tp_slice tp = spec_.tp;
    heads_ = cfg_.num_heads / tp.size;
    kv_heads_ = cfg_.num_kv_heads / tp.size;
    hidden_ = cfg_.hidden_dim / tp.size;
    q_dim_ = heads_ * hd;
    kv_dim_ = kv_heads_ * hd;
    qkv_dim_ = q_dim_ + 2 * kv_dim_;
    for (int32_t l = spec_.first_layer; l < spec_.end_layer; ++l) {
      const layer_weights& w = m.weights.layers[l];
      const matrix_view wq = w.wq.slice_rows(tp.rank * q_dim_, q_dim_);
      const matrix_view wk = w.wk.slice_rows(tp.rank * kv_dim_, kv_dim_);
      const matrix_view wv = w.wv.slice_rows(tp.rank * kv_dim_, kv_dim_);
      const matrix_view wo = w.wo.slice_cols(tp.rank * q_dim_, q_dim_);
      const matrix_view w1 = w.w1.slice_rows(tp.rank * hidden_, hidden_);
      const matrix_view w3 = w.w3.slice_rows(tp.rank * hidden_, hidden_);
      const matrix_view w2 = w.w2.slice_cols(tp.rank * hidden_, hidden_);
      layer dl;
      dl.attn_norm = upload_floats(w.attn_norm, cfg_.dim);
      dl.ffn_norm = upload_floats(w.ffn_norm, cfg_.dim);
      dl.wqkv = device_matrix({&wq, &wk, &wv}, o.weights);
      dl.wo = device_matrix({&wo}, o.weights);
      dl.w13 = device_matrix({&w1, &w3}, o.weights);
      dl.w2 = device_matrix({&w2}, o.weights);
      const size_t cache = size_t(o.num_blocks) * kv_heads_ * o.block_size * hd;
      dl.k = cuda::buffer<float>(cache);
      dl.v = cuda::buffer<float>(cache);
      dl.k.fill_bytes(0);
      dl.v.fill_bytes(0);
      layers_.push_back(std::move(dl));
    }
    if (is_first_stage()) embedding_ = device_matrix({&m.weights.token_embedding}, o.weights);
    if (runs_head()) {
      classifier_ = device_matrix({&m.weights.classifier}, o.weights);
      final_norm_ = upload_floats(m.weights.final_norm, cfg_.dim);
    }
    const int32_t half = cfg_.rope_dim / 2;
    std::vector<float> c(size_t(cfg_.max_seq_len) * half), s(c.size());
    const std::vector<float> freqs = rope_frequencies(cfg_);
    rope_table(c.data(), s.data(), cfg_.max_seq_len, cfg_.rope_dim, freqs.data(), rope_attention_factor(cfg_));
    cos_ = upload_floats(c.data(), c.size());
    sin_ = upload_floats(s.data(), s.size());
    freqs_ = upload_floats(freqs.data(), freqs.size());
    // Scratch for the largest step.
    const int64_t n = o.max_step_tokens;
    const int64_t widest = std::max({int64_t{cfg_.dim}, int64_t{hidden_}, int64_t{q_dim_}});
    x_ = cuda::buffer<float>(n * cfg_.dim);
    xb_ = cuda::buffer<float>(n * cfg_.dim);
    qkv_ = cuda::buffer<float>(n * qkv_dim_);
    att_ = cuda::buffer<float>(n * q_dim_);
    gate_up_ = cuda::buffer<float>(n * 2 * hidden_);
    in_ = cuda::buffer<uint8_t>(size_t(n * widest) * (o.weights == dtype::f32 ? 4 : 2));
    logits_ = cuda::buffer<float>(runs_head() ? n * cfg_.vocab_size : 0);
    ids_ = cuda::buffer<int32_t>(runs_head() ? n : 0);
    choices_ = cuda::buffer<token_choice>(runs_head() ? n : 0);
    choice_staging_ = cuda::pinned<token_choice>(runs_head() ? n : 0);
    sample_workspace_ = cuda::buffer<float>(runs_head() ? cuda::sample_workspace(static_cast<int32_t>(n), cfg_.vocab_size) : 0);
    max_table_ = (cfg_.max_seq_len + o.block_size - 1) / o.block_size;
    // The step's inputs, staged in page-locked memory and copied in one go.
    staging_ = cuda::pinned<int32_t>(size_t(n) * (6 + max_table_));
    inputs_ = cuda::buffer<int32_t>(staging_.size());
    tokens_ = inputs_.get();
    positions_ = tokens_ + n;
    token_seq_ = positions_ + n;
    rows_ = token_seq_ + n;
    static_assert(sizeof(cuda::query_tile) == 2 * sizeof(int32_t));  // at most n tiles, in 2n words
    tiles_ = reinterpret_cast<cuda::query_tile*>(rows_ + n);
    tables_ = reinterpret_cast<uint32_t*>(rows_ + 3 * n);
    workspace_ = cuda::buffer<float>(cuda::paged_attention_workspace(static_cast<int32_t>(n), heads_, hd,
                                                                     cfg_.max_seq_len - 1, o.attention_split));
    eviction_ = std::make_unique<cuda_shard_eviction>(o.num_blocks, o.block_size, max_table_, heads_, kv_heads_, hd);
    // The uploads and memsets ran on the default stream, which a non-blocking stream does
    // not wait for: finish them all before the first step.
    cuda::check(cudaDeviceSynchronize(), "shard set-up");
    cuda::check(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming), "cudaEventCreate");
    // Last, once everything else is in place: connecting waits for the other ranks.
    if (tp.size > 1 && o.tp_group)
      tp_ = std::make_unique<nccl_member>(o.tp_group, tp.rank, o.device);
    else if (tp.size > 1)
      tp_ = std::make_unique<host_staged_collective>(o.host_group->member(tp.rank), size_t(n) * cfg_.dim);
  }

  ~cuda_transformer_shard() override {
    cudaSetDevice(opt_.device);
    // No step is in flight here; dropping the communicators first also ends any NCCL
    // kernel a failed step (or a send no one received) left waiting, so that the stream
    // can drain.
    tp_.reset();
    link_in_.reset();
    link_out_.reset();
    if (stream_) cudaStreamSynchronize(stream_);
    if (computed_) cudaEventDestroy(computed_);
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    gemm_.reset();  // its cuBLAS handle uses the stream
    if (stream_) cudaStreamDestroy(stream_);
  }

  bool is_first_stage() const override { return spec_.first_layer == 0; }
  bool is_last_stage() const override { return spec_.end_layer == cfg_.num_layers; }
  const shard_spec& spec() const override { return spec_; }

  void forward(const step_batch& batch, float* hidden, float* logits) override {
    step(batch, hidden, logits, nullptr, nullptr);
  }

  bool forward_choose(const step_batch& batch, float* hidden, const token_choice* choices, int32_t* next) override {
    if (!runs_head()) return false;
    step(batch, hidden, nullptr, choices, next);
    return true;
  }

  status connect_link(link_side side, std::shared_ptr<nccl_group> group, int32_t rank) override {
    const bool input = side == link_side::input;
    if (input && is_first_stage()) return error{"the first stage takes no input link"};
    if (!input && (is_last_stage() || spec_.tp.rank != 0)) return error{"only rank 0 of a stage before the last sends"};
    if (!group || (input ? rank < 1 : rank != 0) || rank >= group->size())
      return error{"device link: rank " + std::to_string(rank) + " does not fit this side"};
    try {
      auto member = std::make_unique<nccl_member>(std::move(group), rank, opt_.device, link_connect_timeout);
      (input ? link_in_ : link_out_) = std::move(member);
    } catch (const std::runtime_error& e) {  // collective_aborted too
      return error{std::string("device link: ") + e.what()};
    }
    return ok();
  }

  bool has_link(link_side side) const override { return (side == link_side::input ? link_in_ : link_out_) != nullptr; }

  bool take_next_input_from_link() override {
    if (!link_in_) return false;
    input_from_link_ = true;
    return true;
  }

 private:
  // One step; the last stage returns logits (when logits is set) or chosen ids (when next is).
  void step(const step_batch& batch, float* hidden, float* logits, const token_choice* choices, int32_t* next) {
    const bool input_from_link = std::exchange(input_from_link_, false);  // this step's, whatever it holds
    const int32_t n = batch.num_tokens();
    if (n == 0 && batch.compactions.empty()) return;  // (an empty step sends nothing over a link either)
    TROUPE_ASSERT(n <= opt_.max_step_tokens, n, opt_.max_step_tokens);
    cuda::check(cudaSetDevice(opt_.device), "cudaSetDevice");
    if (!batch.compactions.empty()) {
      caches_.clear();
      for (auto& l : layers_) caches_.push_back({l.k.get(), l.v.get(), opt_.num_blocks, kv_heads_, opt_.block_size, cfg_.head_dim});
      for (const kv_compaction& c : batch.compactions)
        eviction_->compact(c, caches_, freqs_.get(), cfg_.rope_dim, cfg_.rope, stream_);
    }
    if (n == 0) return wait_for(nullptr);
    // Links the stage has ended since (a new link is coming, or a peer failed) are dropped
    // before they are used; dropping one ends a send of the last step no one will receive.
    if (link_in_ && link_in_->group().aborted()) link_in_.reset();
    if (link_out_ && link_out_->group().aborted()) link_out_.reset();
    // The step's tokens, positions, sequences, logit rows, query tiles and block tables,
    // staged in the layout of inputs_.
    const int32_t cap = opt_.max_step_tokens;
    int32_t* tokens = staging_.get();
    int32_t* positions = tokens + cap;
    int32_t* token_seq = positions + cap;
    int32_t* rows = token_seq + cap;
    auto* tiles = reinterpret_cast<cuda::query_tile*>(rows + cap);
    uint32_t* tables = reinterpret_cast<uint32_t*>(rows + 3 * cap);
    TROUPE_ASSERT(static_cast<int32_t>(batch.sequences.size()) <= cap, batch.sequences.size(), cap);
    int32_t max_position = 0, t = 0, num_rows = 0, num_tiles = 0, widest_tile = 0;
    for (size_t s = 0; s < batch.sequences.size(); ++s) {
      const auto& sq = batch.sequences[s];
      TROUPE_ASSERT(sq.start_pos >= 0 && sq.start_pos + sq.num_tokens <= cfg_.max_seq_len, sq.start_pos, sq.num_tokens);
      TROUPE_ASSERT(static_cast<int64_t>(sq.block_table.size()) * opt_.block_size >= sq.start_pos + sq.num_tokens &&
                        static_cast<int32_t>(sq.block_table.size()) <= max_table_,
                    sq.block_table.size(), sq.start_pos, sq.num_tokens);
      uint32_t* table = tables + s * max_table_;
      for (size_t b = 0; b < sq.block_table.size(); ++b) {
        TROUPE_ASSERT(sq.block_table[b].value < static_cast<uint32_t>(opt_.num_blocks), sq.block_table[b].value, opt_.num_blocks);
        table[b] = sq.block_table[b].value;
      }
      std::fill(table + sq.block_table.size(), table + max_table_, 0u);
      for (int32_t i = 0; i < sq.num_tokens; i += cuda::prefill_tile_rows) {
        tiles[num_tiles++] = {t + i, std::min(cuda::prefill_tile_rows, sq.num_tokens - i)};
        widest_tile = std::max(widest_tile, tiles[num_tiles - 1].rows);
      }
      for (int32_t i = 0; i < sq.num_tokens; ++i, ++t) {
        positions[t] = sq.start_pos + i;
        token_seq[t] = static_cast<int32_t>(s);
      }
      TROUPE_ASSERT(sq.logit_rows >= 0 && sq.logit_rows <= sq.num_tokens, sq.logit_rows, sq.num_tokens);
      for (int32_t r = sq.logit_rows; r > 0; --r) rows[num_rows++] = t - r;
      max_position = std::max(max_position, sq.start_pos + sq.num_tokens - 1);
    }
    if (is_first_stage()) {
      for (int32_t i = 0; i < n; ++i) {
        TROUPE_ASSERT(batch.tokens[i] >= 0 && batch.tokens[i] < cfg_.vocab_size, batch.tokens[i], cfg_.vocab_size);
        tokens[i] = batch.tokens[i];
      }
    }
    const size_t table_words = batch.sequences.size() * max_table_;
    copy_in(inputs_.get(), staging_.get(), size_t(6) * cap + table_words);
    // Steps carrying a prompt chunk take the tiled attention kernel; decode steps the split
    // one, which spreads a long context over the device.
    num_tiles_ = widest_tile >= 4 ? num_tiles : 0;
    if (!is_first_stage() && !input_from_link)
      copy_in(x_.get(), hidden, size_t(n) * cfg_.dim);
    else if (!is_first_stage())
      on_link(link_in_, [&](nccl_member& l) { l.receive_from_first(x_.get(), int64_t{n} * cfg_.dim, stream_); });
    const bool want_logits = runs_head() && (logits != nullptr || next != nullptr);
    if (!want_logits) num_rows = 0;
    choosing_ = next != nullptr;
    if (choosing_ && num_rows > 0) {
      std::copy_n(choices, num_rows, choice_staging_.get());
      cuda::check(cudaMemcpyAsync(choices_.get(), choice_staging_.get(), sizeof(token_choice) * num_rows,
                                  cudaMemcpyHostToDevice, stream_),
                  "copy to the device");
    }
    const int32_t splits = cuda::paged_attention_splits(max_position, opt_.attention_split);
    // (A step that sums attention for KV eviction runs its kernels one by one.)
    const bool attention = eviction_->stage(batch, stream_) > 0;
    if (n <= opt_.graph_max_tokens && !tp_ && !attention)
      replay(n, splits, max_position, num_rows);
    else
      enqueue_step(n, max_position, num_rows);
    eviction_->fetch(tp_.get(), stream_);
    if (num_rows > 0 && choosing_)
      copy_out(next, ids_.get(), size_t(num_rows));
    else if (num_rows > 0)
      copy_out(logits, logits_.get(), size_t(num_rows) * cfg_.vocab_size);
    else if (!is_last_stage() && link_out_) {
      // The receivers post their side only once this step has answered: wait for the
      // computation, not the send (the next step's work queues behind it).
      cuda::check(cudaEventRecord(computed_, stream_), "cudaEventRecord");
      on_link(link_out_, [&](nccl_member& l) { l.send_to_all(x_.get(), int64_t{n} * cfg_.dim, stream_); });
      wait_for(computed_);
      return eviction_->add_to(batch);
    } else if (!is_last_stage())
      copy_out(hidden, x_.get(), size_t(n) * cfg_.dim);
    wait_for(nullptr);
    eviction_->add_to(batch);
  }

  // Until the stream has run up to `until` (an event; null: all of it). Where NCCL is in
  // use, polling each group this shard is in: a failed or aborted tensor-parallel group
  // throws collective_aborted, a failed or aborted device link device_link_broken.
  void wait_for(cudaEvent_t until) {
    if (!tp_ && !link_in_ && !link_out_) {
      cuda::check(until ? cudaEventSynchronize(until) : cudaStreamSynchronize(stream_), "forward step");
      return;
    }
    using namespace std::chrono_literals;
    // Spin briefly (a step's end is usually near), then poll more gently.
    for (int polls = 0;; ++polls) {
      const cudaError_t q = until ? cudaEventQuery(until) : cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda::check(q, "forward step");
      if (tp_) tp_->check();
      if (link_in_) on_link(link_in_, [](nccl_member& l) { l.check(); });
      if (link_out_) on_link(link_out_, [](nccl_member& l) { l.check(); });
      if (polls > 2000) std::this_thread::sleep_for(20us);
    }
  }

  // Runs `op` on `link`; a failure drops the link (aborting its communicator ends any of
  // its kernels still waiting) and throws device_link_broken.
  template <typename Op>
  void on_link(std::unique_ptr<nccl_member>& link, Op&& op) {
    if (!link) throw device_link_broken("this stage has no device link to take its hidden states from");
    try {
      op(*link);
    } catch (const collective_aborted& e) {
      link.reset();
      throw device_link_broken(std::string("device link: ") + e.what());
    }
  }

  // Rank 0 of the last stage: the final norm, the classifier and the choice of tokens.
  bool runs_head() const { return is_last_stage() && spec_.tp.rank == 0; }

  // The residual stream plus this layer's partial sums of every rank, on every rank (the
  // partial is already in x_: added by rank 0, in place of x_ elsewhere).
  void reduce_residual(int32_t n) {
    if (tp_) tp_->all_reduce_sum(x_.get(), int64_t{n} * cfg_.dim, stream_);
  }
  // Whether this rank adds its projections into x_ (rank 0) or writes them there.
  bool adds_residual() const { return spec_.tp.rank == 0; }

  struct layer {
    cuda::buffer<float> attn_norm, ffn_norm;
    device_matrix wqkv, wo, w13, w2;
    cuda::buffer<float> k, v;  // the layer's KV cache
  };

  template <typename T>
  void copy_in(T* dev, const T* host, size_t n) {
    cuda::check(cudaMemcpyAsync(dev, host, n * sizeof(T), cudaMemcpyHostToDevice, stream_), "copy to the device");
  }
  template <typename T>
  void copy_out(T* host, const T* dev, size_t n) {
    cuda::check(cudaMemcpyAsync(host, dev, n * sizeof(T), cudaMemcpyDeviceToHost, stream_), "copy to the host");
  }

  // The graph of a step shape, captured the first time it is seen (up to max_graphs
  // shapes), then replayed; its kernels read the step's inputs from inputs_, which step()
  // fills first.
  static constexpr size_t max_graphs = 256;
  void replay(int32_t n, int32_t splits, int32_t max_position, int32_t rows) {
    const auto key = std::make_tuple(n, splits, rows, choosing_, num_tiles_);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      if (graphs_.size() >= max_graphs) return enqueue_step(n, max_position, rows);
      cudaGraph_t graph = nullptr;
      cuda::check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      try {
        enqueue_step(n, max_position, rows);
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      cuda::check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
      cudaGraphExec_t exec = nullptr;
      const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      cuda::check(made, "cudaGraphInstantiate");
      it = graphs_.emplace(key, exec).first;
    }
    cuda::check(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
  }

  // Every kernel of a step, on stream_: embedding, the layers, the final norm and the
  // classifier for `rows` rows.
  void enqueue_step(int32_t n, int32_t max_position, int32_t rows) {
    const cuda::token_batch tb{positions_, token_seq_, tables_, max_table_, n};
    if (is_first_stage())
      cuda::embedding(embedding_.type, embedding_.data(), cfg_.dim, cfg_.dim, tokens_, n, x_.get(), cfg_.dim, stream_);
    for (auto& l : layers_) enqueue_layer(l, tb, n, max_position);
    if (rows > 0) {
      // The rows wanted, gathered (an embedding lookup in the hidden states), normed, projected.
      cuda::embedding(dtype::f32, x_.get(), cfg_.dim, cfg_.dim, rows_, rows, xb_.get(), cfg_.dim, stream_);
      if (fused(rows)) {
        gemv(classifier_, {cuda::gemv_input::rmsnorm, xb_.get(), final_norm_.get(), cfg_.rms_eps}, logits_.get(), rows,
             false);
      } else {
        cuda::rmsnorm_to(opt_.weights, in_.get(), cfg_.dim, xb_.get(), cfg_.dim, final_norm_.get(), rows, cfg_.dim,
                         cfg_.rms_eps, stream_);
        matmul(classifier_, in_.get(), logits_.get(), rows, false);
      }
      if (choosing_)
        cuda::sample(logits_.get(), cfg_.vocab_size, rows, cfg_.vocab_size, choices_.get(), sample_workspace_.get(),
                     ids_.get(), stream_);
    }
  }

  void matmul(const device_matrix& w, const void* in, float* out, int32_t m, bool accumulate) {
    gemm_->run(w.type, in, w.data(), out, m, w.rows, w.cols, accumulate);
  }

  // Whether a step of n tokens takes the GEMV path: every GEMM of the layer as a GEMV that
  // stages its own input (the norm, the attention output's rounding, SiLU x up), so a
  // decode layer is six launches.
  bool fused(int32_t n) const {
    return n <= opt_.gemv_max_rows && opt_.weights != dtype::f32 && cuda::gemv_fits(n, cfg_.dim) && cuda::gemv_fits(n, q_dim_) &&
           cuda::gemv_fits(n, hidden_);
  }

  void gemv(const device_matrix& w, const cuda::gemv_source& x, float* out, int32_t m, bool accumulate) {
    cuda::gemv(w.type, x, w.half.get(), out, m, w.rows, w.cols, accumulate, stream_);
  }

  void enqueue_layer(layer& w, const cuda::token_batch& tb, int32_t n, int32_t max_position) {
    const int32_t dim = cfg_.dim, hd = cfg_.head_dim, heads = heads_, kvh = kv_heads_;
    const dtype wt = opt_.weights;
    const paged_kv_layer cache{w.k.get(), w.v.get(), opt_.num_blocks, kvh, opt_.block_size, hd};
    float* qkv = qkv_.get();
    const bool gemv_path = fused(n);
    using cuda::gemv_input;
    if (gemv_path) {
      gemv(w.wqkv, {gemv_input::rmsnorm, x_.get(), w.attn_norm.get(), cfg_.rms_eps}, qkv, n, false);
    } else {
      cuda::rmsnorm_to(wt, in_.get(), dim, x_.get(), dim, w.attn_norm.get(), n, dim, cfg_.rms_eps, stream_);
      matmul(w.wqkv, in_.get(), qkv, n, false);
    }
    cuda::rope_kv_write(cache, qkv, qkv_dim_, heads, cfg_.rope_dim, cos_.get(), sin_.get(), cfg_.rope, tb, stream_);
    if (num_tiles_ > 0)
      cuda::prefill_attention(qkv, qkv_dim_, att_.get(), q_dim_, tb, tiles_, num_tiles_, heads, cache, stream_);
    else
      cuda::paged_attention(qkv, qkv_dim_, att_.get(), q_dim_, tb, heads, max_position, cache, workspace_.get(),
                            opt_.attention_split, stream_);
    eviction_->add_layer(qkv, qkv_dim_, tb, cache, stream_);
    const bool add = adds_residual();
    if (gemv_path) {
      gemv(w.wo, {gemv_input::f32, att_.get()}, x_.get(), n, add);
      reduce_residual(n);
      gemv(w.w13, {gemv_input::rmsnorm, x_.get(), w.ffn_norm.get(), cfg_.rms_eps}, gate_up_.get(), n, false);
      gemv(w.w2, {gemv_input::silu_mul, gate_up_.get()}, x_.get(), n, add);
      reduce_residual(n);
      return;
    }
    if (wt == dtype::f32) {
      matmul(w.wo, att_.get(), x_.get(), n, add);
    } else {
      cuda::f32_to(wt, att_.get(), in_.get(), int64_t{n} * q_dim_, stream_);
      matmul(w.wo, in_.get(), x_.get(), n, add);
    }
    reduce_residual(n);
    cuda::rmsnorm_to(wt, in_.get(), dim, x_.get(), dim, w.ffn_norm.get(), n, dim, cfg_.rms_eps, stream_);
    matmul(w.w13, in_.get(), gate_up_.get(), n, false);
    cuda::silu_mul_rows(gate_up_.get(), n, hidden_, wt, in_.get(), stream_);
    matmul(w.w2, in_.get(), x_.get(), n, add);
    reduce_residual(n);
  }

  const model_config& cfg_;
  shard_spec spec_;
  cuda_shard_options opt_;
  // How long a device link's ranks wait for each other to connect.
  static constexpr std::chrono::milliseconds link_connect_timeout{30000};

  int32_t heads_ = 0, kv_heads_ = 0, hidden_ = 0;  // this rank's slice
  int32_t q_dim_ = 0, kv_dim_ = 0, qkv_dim_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::gemm_engine> gemm_;
  std::vector<layer> layers_;
  device_matrix embedding_, classifier_;
  cuda::buffer<float> final_norm_, cos_, sin_, freqs_;
  cuda::buffer<float> x_, xb_, qkv_, att_, gate_up_, logits_, workspace_;
  cuda::buffer<uint8_t> in_;  // the GEMMs' input, in the weights' type
  cuda::pinned<int32_t> staging_;
  cuda::buffer<int32_t> inputs_;  // tokens, positions, token_seq, rows: max_step_tokens each; the tiles; the tables
  int32_t *tokens_ = nullptr, *positions_ = nullptr, *token_seq_ = nullptr, *rows_ = nullptr;
  cuda::query_tile* tiles_ = nullptr;
  int32_t num_tiles_ = 0;  // this step's tiles for the prefill kernel; 0: the split kernel
  uint32_t* tables_ = nullptr;
  int32_t max_table_ = 0;
  cuda::buffer<int32_t> ids_;  // chosen tokens, one per logit row
  cuda::buffer<token_choice> choices_;
  cuda::pinned<token_choice> choice_staging_;
  cuda::buffer<float> sample_workspace_;
  bool choosing_ = false;  // this step ends in the choice of tokens on the device
  std::map<std::tuple<int32_t, int32_t, int32_t, bool, int32_t>, cudaGraphExec_t> graphs_;
  std::unique_ptr<gpu_collective> tp_;  // this rank's all-reduce, when tensor-parallel
  std::unique_ptr<nccl_member> link_in_, link_out_;  // device links to the neighbouring stages
  bool input_from_link_ = false;                     // the next step's input comes over link_in_
  cudaEvent_t computed_ = nullptr;                   // a sending step's work, before its send
  std::unique_ptr<cuda_shard_eviction> eviction_;  // KV eviction's sums and compactions
  std::vector<paged_kv_layer> caches_;               // the layers' caches, for a compaction
};

}  // namespace

status cuda_device_usable(int device) {
  const int count = cuda::device_count();
  if (device < 0 || device >= count)
    return error{"device cuda:" + std::to_string(device) + ": no such device (" + std::to_string(count) +
                 " CUDA device(s) visible)"};
  return ok();
}

expected<std::unique_ptr<forward_shard>> make_cuda_shard(const model& m, const shard_spec& spec,
                                                         const cuda_shard_options& o) {
  const std::string dev = "cuda:" + std::to_string(o.device);
  if (o.weights != dtype::f32 && o.weights != dtype::bf16 && o.weights != dtype::f16)
    return error{dev + ": GPU weights must be f32, bf16 or f16"};
  if (m.config.qkv_bias)
    return error{dev + ": models with q/k/v biases (" + family_name(m.config.family) +
                 ") run on CPU shards (the CUDA shard has no bias kernels yet)"};
  if (m.config.sliding_window > 0)
    return error{dev + ": sliding-window attention runs on CPU shards (the CUDA attention kernels attend to whole sequences)"};
  if (spec.tp.size > 1) {
    if (spec.tp.rank < 0 || spec.tp.rank >= spec.tp.size)
      return error{dev + ": tensor-parallel rank " + std::to_string(spec.tp.rank) + " of " + std::to_string(spec.tp.size)};
    // (Q8_0 weights are sliced before they are dequantized: a slice may not cut a group.)
    const int32_t q8_group = m.weight_type == dtype::q8_0 ? m.weights.layers[0].wq.group_size : 0;
    if (auto e = check_tp_split(m.config, spec.tp.size, q8_group)) return error{dev + ": " + *e};
    const int32_t ranks = o.tp_group ? o.tp_group->size() : o.host_group ? o.host_group->size() : 0;
    if (ranks != spec.tp.size)
      return error{dev + ": a tensor-parallel shard needs its stage's group of " + std::to_string(spec.tp.size) +
                   " ranks (NCCL or host memory)"};
  }
  if (auto usable = cuda_device_usable(o.device); !usable) return usable.err();
  try {
    return std::unique_ptr<forward_shard>(new cuda_transformer_shard(m, spec, o));
  } catch (const cuda::cuda_error& e) {
    return error{dev + ": " + e.what()};
  } catch (const std::runtime_error& e) {  // the tensor-parallel connection (collective_aborted too)
    return error{dev + ": " + e.what()};
  }
}

}  // namespace troupe
