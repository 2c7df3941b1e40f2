// cuda_transformer_shard: the forward pass of transformer_shard, step for step, on a GPU:
// the same layer loop over the CUDA kernels (kernels/cuda/) and cuBLAS. Weights go to
// device memory once, at construction: f32, or bf16/f16 for the tensor cores (Q8_0 and
// 16-bit checkpoints are dequantized on the host first). The KV cache lives in device
// memory in the CPU's block layout. Hidden states and logits cross to the host at the
// shard's edges only.
#include <cstring>

#include "engine/forward/forward_shard.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cuda/add.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/paged_attention.hpp"
#include "kernels/cuda/rmsnorm.hpp"
#include "kernels/cuda/rope.hpp"
#include "kernels/cuda/silu_mul.hpp"

namespace troupe {

namespace {

// A weight matrix [rows][cols] in device memory, f32 or 16-bit.
struct device_matrix {
  dtype type = dtype::f32;
  int32_t rows = 0, cols = 0;
  cuda::buffer<float> f32;
  cuda::buffer<uint16_t> half;

  device_matrix() = default;
  device_matrix(const matrix_view& w, dtype to) : type(to), rows(w.rows), cols(w.cols) {
    // Dequantize on the host (any stored type, slices included), then convert and upload.
    std::vector<float> host(size_t(rows) * cols);
    std::vector<int32_t> all(rows);
    for (int32_t r = 0; r < rows; ++r) all[r] = r;
    embedding(w, all.data(), rows, host.data(), cols);
    if (to == dtype::f32) {
      f32 = cuda::buffer<float>(host.size());
      f32.upload(host);
      return;
    }
    std::vector<uint16_t> h(host.size());
    for (size_t i = 0; i < host.size(); ++i) h[i] = to == dtype::bf16 ? f32_to_bf16(host[i]) : f32_to_f16(host[i]);
    half = cuda::buffer<uint16_t>(h.size());
    half.upload(h);
  }
  const void* data() const { return type == dtype::f32 ? static_cast<const void*>(f32.get()) : half.get(); }
};

cuda::buffer<float> upload_floats(const float* p, size_t n) {
  cuda::buffer<float> b(n);
  b.upload(p, n);
  return b;
}

class cuda_transformer_shard final : public forward_shard {
 public:
  cuda_transformer_shard(const model& m, const shard_spec& spec, const cuda_shard_options& o)
      : model_(m), cfg_(m.config), spec_(spec), opt_(o) {
    if (spec_.end_layer == 0) spec_.end_layer = cfg_.num_layers;
    cuda::check(cudaSetDevice(o.device), "cudaSetDevice");
    cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    gemm_ = std::make_unique<cuda::gemm_engine>(stream_);
    const int32_t hd = cfg_.head_dim;
    for (int32_t l = spec_.first_layer; l < spec_.end_layer; ++l) {
      const layer_weights& w = m.weights.layers[l];
      layer dl;
      dl.attn_norm = upload_floats(w.attn_norm, cfg_.dim);
      dl.ffn_norm = upload_floats(w.ffn_norm, cfg_.dim);
      dl.wq = device_matrix(w.wq, o.weights);
      dl.wk = device_matrix(w.wk, o.weights);
      dl.wv = device_matrix(w.wv, o.weights);
      dl.wo = device_matrix(w.wo, o.weights);
      dl.w1 = device_matrix(w.w1, o.weights);
      dl.w2 = device_matrix(w.w2, o.weights);
      dl.w3 = device_matrix(w.w3, o.weights);
      const size_t cache = size_t(o.num_blocks) * cfg_.num_kv_heads * o.block_size * hd;
      dl.k = cuda::buffer<float>(cache);
      dl.v = cuda::buffer<float>(cache);
      dl.k.fill_bytes(0);
      dl.v.fill_bytes(0);
      layers_.push_back(std::move(dl));
    }
    if (is_first_stage()) embedding_ = device_matrix(m.weights.token_embedding, o.weights);
    if (is_last_stage()) {
      classifier_ = device_matrix(m.weights.classifier, o.weights);
      final_norm_ = upload_floats(m.weights.final_norm, cfg_.dim);
    }
    const int32_t half = cfg_.rope_dim / 2;
    std::vector<float> c(size_t(cfg_.max_seq_len) * half), s(c.size());
    rope_table(c.data(), s.data(), cfg_.max_seq_len, cfg_.rope_dim, cfg_.rope_base);
    cos_ = upload_floats(c.data(), c.size());
    sin_ = upload_floats(s.data(), s.size());
    // Scratch for the largest step.
    const int64_t n = o.max_step_tokens;
    const int64_t widest = std::max<int64_t>(cfg_.dim, cfg_.hidden_dim);
    x_ = cuda::buffer<float>(n * cfg_.dim);
    xb_ = cuda::buffer<float>(n * cfg_.dim);
    q_ = cuda::buffer<float>(n * cfg_.num_heads * hd);
    k_ = cuda::buffer<float>(n * cfg_.num_kv_heads * hd);
    v_ = cuda::buffer<float>(n * cfg_.num_kv_heads * hd);
    att_ = cuda::buffer<float>(n * cfg_.num_heads * hd);
    proj_ = cuda::buffer<float>(n * cfg_.dim);
    gate_ = cuda::buffer<float>(n * cfg_.hidden_dim);
    up_ = cuda::buffer<float>(n * cfg_.hidden_dim);
    x16_ = cuda::buffer<uint16_t>(n * widest);
    logits_ = cuda::buffer<float>(is_last_stage() ? n * cfg_.vocab_size : 0);
    tokens_ = cuda::buffer<int32_t>(n);
    positions_ = cuda::buffer<int32_t>(n);
    token_seq_ = cuda::buffer<int32_t>(n);
    rows_ = cuda::buffer<int32_t>(n);
    max_table_ = (cfg_.max_seq_len + o.block_size - 1) / o.block_size;
    tables_ = cuda::buffer<uint32_t>(size_t(n) * max_table_);
    workspace_ = cuda::buffer<float>(cuda::paged_attention_workspace(static_cast<int32_t>(n), cfg_.num_heads, hd,
                                                                     cfg_.max_seq_len - 1, o.attention_split));
    // The uploads and memsets ran on the default stream, which a non-blocking stream does
    // not wait for: finish them all before the first step.
    cuda::check(cudaDeviceSynchronize(), "shard set-up");
  }

  ~cuda_transformer_shard() override {
    cudaSetDevice(opt_.device);
    if (stream_) cudaStreamSynchronize(stream_);
    gemm_.reset();  // its cuBLAS handle uses the stream
    if (stream_) cudaStreamDestroy(stream_);
  }

  bool is_first_stage() const override { return spec_.first_layer == 0; }
  bool is_last_stage() const override { return spec_.end_layer == cfg_.num_layers; }
  const shard_spec& spec() const override { return spec_; }

  void forward(const step_batch& batch, float* hidden, float* logits) override {
    const int32_t n = batch.num_tokens();
    if (n == 0) return;
    TROUPE_ASSERT(n <= opt_.max_step_tokens, n, opt_.max_step_tokens);
    cuda::check(cudaSetDevice(opt_.device), "cudaSetDevice");
    // The step's positions, sequences and block tables, for the kernels.
    h_positions_.clear();
    h_token_seq_.clear();
    h_tables_.assign(batch.sequences.size() * max_table_, 0u);
    int32_t max_position = 0;
    for (size_t s = 0; s < batch.sequences.size(); ++s) {
      const auto& sq = batch.sequences[s];
      TROUPE_ASSERT(sq.start_pos >= 0 && sq.start_pos + sq.num_tokens <= cfg_.max_seq_len, sq.start_pos, sq.num_tokens);
      TROUPE_ASSERT(static_cast<int64_t>(sq.block_table.size()) * opt_.block_size >= sq.start_pos + sq.num_tokens &&
                        static_cast<int32_t>(sq.block_table.size()) <= max_table_,
                    sq.block_table.size(), sq.start_pos, sq.num_tokens);
      for (size_t b = 0; b < sq.block_table.size(); ++b) {
        TROUPE_ASSERT(sq.block_table[b] < static_cast<uint32_t>(opt_.num_blocks), sq.block_table[b], opt_.num_blocks);
        h_tables_[s * max_table_ + b] = sq.block_table[b];
      }
      for (int32_t i = 0; i < sq.num_tokens; ++i) {
        h_positions_.push_back(sq.start_pos + i);
        h_token_seq_.push_back(static_cast<int32_t>(s));
      }
      max_position = std::max(max_position, sq.start_pos + sq.num_tokens - 1);
    }
    copy_in(positions_.get(), h_positions_.data(), h_positions_.size());
    copy_in(token_seq_.get(), h_token_seq_.data(), h_token_seq_.size());
    copy_in(tables_.get(), h_tables_.data(), h_tables_.size());
    const cuda::token_batch tb{positions_.get(), token_seq_.get(), tables_.get(), max_table_, n};

    if (is_first_stage()) {
      for (int32_t t : batch.tokens) TROUPE_ASSERT(t >= 0 && t < cfg_.vocab_size, t, cfg_.vocab_size);
      copy_in(tokens_.get(), batch.tokens.data(), batch.tokens.size());
      cuda::embedding(embedding_.type, embedding_.data(), cfg_.dim, cfg_.dim, tokens_.get(), n, x_.get(), cfg_.dim, stream_);
    } else {
      copy_in(x_.get(), hidden, size_t(n) * cfg_.dim);
    }
    for (auto& l : layers_) run_layer(l, tb, n, max_position);
    if (is_last_stage() && logits != nullptr && spec_.tp.rank == 0) {
      h_rows_.clear();
      int32_t token = 0;
      for (const auto& sq : batch.sequences) {
        token += sq.num_tokens;
        if (sq.want_logits) h_rows_.push_back(token - 1);
      }
      const int32_t rows = static_cast<int32_t>(h_rows_.size());
      copy_in(rows_.get(), h_rows_.data(), h_rows_.size());
      // The rows wanted, gathered (an embedding lookup in the hidden states), normed, projected.
      cuda::embedding(dtype::f32, x_.get(), cfg_.dim, cfg_.dim, rows_.get(), rows, xb_.get(), cfg_.dim, stream_);
      cuda::rmsnorm(xb_.get(), xb_.get(), cfg_.dim, final_norm_.get(), rows, cfg_.dim, cfg_.rms_eps, stream_);
      matmul(classifier_, xb_.get(), logits_.get(), rows);
      copy_out(logits, logits_.get(), size_t(rows) * cfg_.vocab_size);
    } else if (!is_last_stage()) {
      copy_out(hidden, x_.get(), size_t(n) * cfg_.dim);
    }
    cuda::check(cudaStreamSynchronize(stream_), "forward step");
  }

 private:
  struct layer {
    cuda::buffer<float> attn_norm, ffn_norm;
    device_matrix wq, wk, wv, wo, w1, w2, w3;
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

  void matmul(const device_matrix& w, const float* in, float* out, int32_t m) {
    if (w.type == dtype::f32)
      gemm_->f32(in, w.f32.get(), out, m, w.rows, w.cols);
    else
      gemm_->half(w.type, in, x16_.get(), w.half.get(), out, m, w.rows, w.cols);
  }

  void run_layer(layer& w, const cuda::token_batch& tb, int32_t n, int32_t max_position) {
    const int32_t dim = cfg_.dim, hd = cfg_.head_dim, heads = cfg_.num_heads, kvh = cfg_.num_kv_heads;
    const int32_t q_dim = heads * hd, kv_dim = kvh * hd;
    const paged_kv_layer cache{w.k.get(), w.v.get(), opt_.num_blocks, kvh, opt_.block_size, hd};
    cuda::rmsnorm(xb_.get(), x_.get(), dim, w.attn_norm.get(), n, dim, cfg_.rms_eps, stream_);
    matmul(w.wq, xb_.get(), q_.get(), n);
    matmul(w.wk, xb_.get(), k_.get(), n);
    matmul(w.wv, xb_.get(), v_.get(), n);
    cuda::rope(q_.get(), q_dim, n, heads, hd, cfg_.rope_dim, cos_.get(), sin_.get(), positions_.get(), cfg_.rope, stream_);
    cuda::rope(k_.get(), kv_dim, n, kvh, hd, cfg_.rope_dim, cos_.get(), sin_.get(), positions_.get(), cfg_.rope, stream_);
    cuda::paged_kv_write(cache, k_.get(), v_.get(), kv_dim, tb, stream_);
    cuda::paged_attention(q_.get(), q_dim, att_.get(), q_dim, tb, heads, max_position, cache, workspace_.get(),
                          opt_.attention_split, stream_);
    matmul(w.wo, att_.get(), proj_.get(), n);
    cuda::add_inplace(x_.get(), proj_.get(), int64_t{n} * dim, stream_);
    cuda::rmsnorm(xb_.get(), x_.get(), dim, w.ffn_norm.get(), n, dim, cfg_.rms_eps, stream_);
    matmul(w.w1, xb_.get(), gate_.get(), n);
    matmul(w.w3, xb_.get(), up_.get(), n);
    cuda::silu_mul(gate_.get(), up_.get(), int64_t{n} * cfg_.hidden_dim, stream_);
    matmul(w.w2, gate_.get(), proj_.get(), n);
    cuda::add_inplace(x_.get(), proj_.get(), int64_t{n} * dim, stream_);
  }

  const model& model_;
  const model_config& cfg_;
  shard_spec spec_;
  cuda_shard_options opt_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::gemm_engine> gemm_;
  std::vector<layer> layers_;
  device_matrix embedding_, classifier_;
  cuda::buffer<float> final_norm_, cos_, sin_;
  cuda::buffer<float> x_, xb_, q_, k_, v_, att_, proj_, gate_, up_, logits_, workspace_;
  cuda::buffer<uint16_t> x16_;
  cuda::buffer<int32_t> tokens_, positions_, token_seq_, rows_;
  cuda::buffer<uint32_t> tables_;
  int32_t max_table_ = 0;
  std::vector<int32_t> h_positions_, h_token_seq_, h_rows_;
  std::vector<uint32_t> h_tables_;
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
  if (spec.tp.size > 1)
    return error{dev + ": tensor parallelism on GPUs needs NCCL all-reduce, which this build does not have yet"};
  if (o.weights != dtype::f32 && o.weights != dtype::bf16 && o.weights != dtype::f16)
    return error{dev + ": GPU weights must be f32, bf16 or f16"};
  if (auto usable = cuda_device_usable(o.device); !usable) return usable.err();
  try {
    return std::unique_ptr<forward_shard>(new cuda_transformer_shard(m, spec, o));
  } catch (const cuda::cuda_error& e) {
    return error{dev + ": " + e.what()};
  }
}

}  // namespace troupe
