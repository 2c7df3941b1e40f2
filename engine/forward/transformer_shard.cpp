#include "engine/forward/transformer_shard.hpp"

#include "engine/forward/kv_cache_type.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/gemm_w8a8.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/silu_mul.hpp"

namespace troupe {

namespace {

template <class V>
typename V::value_type* grow(V& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

}  // namespace

kv_cache_shape transformer_shard::cache_shape(const model_config& c, const shard_spec& spec,
                                              int32_t num_blocks, int32_t block_size, dtype kv_type) {
  const int32_t end = spec.end_layer == 0 ? c.num_layers : spec.end_layer;
  kv_cache_shape s;
  s.num_layers = end - spec.first_layer;
  s.num_blocks = num_blocks;
  s.num_kv_heads = c.num_kv_heads / spec.tp.size;
  s.block_size = block_size;
  s.head_dim = c.head_dim;
  s.type = kv_type;
  return s;
}

std::string transformer_shard::cpu_kernels(const model& m, std::optional<dtype> kv_type) {
  std::string out = std::string(dtype_name(m.weight_type)) + " weights";
  if (m.weight_type == dtype::q8_0 && !m.weights.layers.empty()) {
    const auto kernel = w8a8_kernel_in_use();
    if (!kernel || !w8a8_layout(m.weights.layers[0].wq))
      out += " with float activations";
    else if (*kernel == w8a8_kernel::amx)
      out += " with int8 activations (AMX and VNNI)";
    else
      out += *kernel == w8a8_kernel::vnni ? " with int8 activations (VNNI)" : " with int8 activations (scalar, TROUPE_W8A8)";
  }
  switch (kv_type.value_or(kv_cache_type_for(m))) {
    case dtype::f16: return out + ", F16 KV cache";
    case dtype::q8_0: return out + ", int8 KV cache";
    default: return out + ", F32 KV cache";
  }
}

transformer_shard::transformer_shard(const model& m, const shard_spec& spec, kv_cache& kv,
                                     thread_pool& pool, collective& comm)
    : model_(m), cfg_(m.config), spec_(spec), kv_(kv), pool_(pool), comm_(comm) {
  if (spec_.end_layer == 0) spec_.end_layer = cfg_.num_layers;
  TROUPE_ASSERT(spec_.first_layer >= 0 && spec_.first_layer < spec_.end_layer &&
                    spec_.end_layer <= cfg_.num_layers,
                spec_.first_layer, spec_.end_layer, cfg_.num_layers);
  const tp_slice tp = spec_.tp;
  TROUPE_ASSERT(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, tp.rank, tp.size);
  local_heads_ = cfg_.num_heads / tp.size;
  local_kv_heads_ = cfg_.num_kv_heads / tp.size;
  local_hidden_ = cfg_.hidden_dim / tp.size;
  TROUPE_ASSERT(local_heads_ * tp.size == cfg_.num_heads &&
                local_kv_heads_ * tp.size == cfg_.num_kv_heads &&
                local_hidden_ * tp.size == cfg_.hidden_dim, "split checked by check_tp_split");
  const kv_cache_shape& ks = kv_.shape();
  TROUPE_ASSERT(ks.num_layers == spec_.end_layer - spec_.first_layer &&
                ks.num_kv_heads == local_kv_heads_ && ks.head_dim == cfg_.head_dim,
                ks.num_layers, ks.num_kv_heads, ks.head_dim);

  const int32_t hd = cfg_.head_dim;
  for (int32_t l = spec_.first_layer; l < spec_.end_layer; ++l) {
    const layer_weights& w = m.weights.layers[l];
    sliced_layer s;
    s.attn_norm = w.attn_norm;
    s.ffn_norm = w.ffn_norm;
    s.wq = w.wq.slice_rows(tp.rank * local_heads_ * hd, local_heads_ * hd);
    s.wk = w.wk.slice_rows(tp.rank * local_kv_heads_ * hd, local_kv_heads_ * hd);
    s.wv = w.wv.slice_rows(tp.rank * local_kv_heads_ * hd, local_kv_heads_ * hd);
    s.wo = w.wo.slice_cols(tp.rank * local_heads_ * hd, local_heads_ * hd);
    s.w1 = w.w1.slice_rows(tp.rank * local_hidden_, local_hidden_);
    s.w3 = w.w3.slice_rows(tp.rank * local_hidden_, local_hidden_);
    s.w2 = w.w2.slice_cols(tp.rank * local_hidden_, local_hidden_);
    s.bq = w.bq ? w.bq + int64_t{tp.rank} * local_heads_ * hd : nullptr;
    s.bk = w.bk ? w.bk + int64_t{tp.rank} * local_kv_heads_ * hd : nullptr;
    s.bv = w.bv ? w.bv + int64_t{tp.rank} * local_kv_heads_ * hd : nullptr;
    layers_.push_back(s);
  }
  classifier_ = model_.weights.classifier;
  if (w8a8_kernel_in_use()) {
    // q8_0 weights run with int8 activations: each matrix repacked once per process (the
    // model keeps the copies), in parallel.
    std::vector<matrix_view*> todo;
    for (auto& l : layers_)
      for (matrix_view* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3})
        if (w8a8_layout(*w)) todo.push_back(w);
    if (is_last_stage() && tp.rank == 0 && w8a8_layout(classifier_)) todo.push_back(&classifier_);
    std::vector<const q8_packed*> packed(todo.size());
    pool_.parallel_for_dynamic(static_cast<int64_t>(todo.size()),
                               [&](int64_t i, int) { packed[i] = &model_.packed->get(*todo[i]); });
    for (size_t i = 0; i < todo.size(); ++i) todo[i]->packed = packed[i];
  }
  const int32_t half = cfg_.rope_dim / 2;
  rope_cos_.resize(int64_t{cfg_.max_seq_len} * half);
  rope_sin_.resize(int64_t{cfg_.max_seq_len} * half);
  rope_freqs_ = rope_frequencies(cfg_);
  rope_table(rope_cos_.data(), rope_sin_.data(), cfg_.max_seq_len, cfg_.rope_dim, rope_freqs_.data(),
             rope_attention_factor(cfg_));
}

void transformer_shard::forward(const step_batch& batch, float* hidden, float* logits) {
  run(batch, hidden, logits, static_cast<int32_t>(layers_.size()), is_last_stage() && logits != nullptr && spec_.tp.rank == 0);
}

void transformer_shard::forward_early_exit(const step_batch& batch, float* hidden, float* logits, int32_t exit_layer) {
  TROUPE_ASSERT(is_first_stage() && spec_.tp.size == 1, "early exit runs the model's first layers, whole");
  TROUPE_ASSERT(exit_layer >= 1 && exit_layer <= static_cast<int32_t>(layers_.size()), exit_layer, layers_.size());
  run(batch, hidden, logits, exit_layer, true);
}

void transformer_shard::run(const step_batch& batch, float* hidden, float* logits, int32_t num_layers, bool head) {
  for (const kv_compaction& c : batch.compactions) compact(c);
  const int32_t n = batch.num_tokens();
  if (n == 0) return;
  // Per-token attention inputs: position and block table of the token's sequence, its
  // block ids as the kernels read them (one array, sized first: the tokens point into it).
  att_tokens_.clear();
  rope_at_.clear();
  size_t table_entries = 0;
  for (const auto& s : batch.sequences) table_entries += s.block_table.size();
  tables_.resize(table_entries);
  uint32_t* table = tables_.data();
  // Where eviction policies want the attention each slot receives: the softmax weights of
  // each such sequence's last tokens (attention_mass_rows of them, every head, over the
  // slots its last token sees), summed per sequence after each layer.
  const bool attention = batch.wants_attention();
  int64_t weight_values = 0, mass_values = 0;
  if (attention)
    for (const auto& s : batch.sequences) {
      if (!s.attention_mass) continue;
      weight_values += int64_t{local_heads_} * attention_mass_rows(s.num_tokens) * (s.start_pos + s.num_tokens);
      mass_values += s.start_pos + s.num_tokens;
    }
  float* weights = attention ? grow(weights_, weight_values) : nullptr;
  int64_t mass_at = 0;
  if (attention) {
    mass_.assign(static_cast<size_t>(mass_values), 0.0f);
    mass_at_.clear();
  }
  for (const auto& s : batch.sequences) {
    const int32_t rope0 = s.rope_pos < 0 ? s.start_pos : s.rope_pos;
    TROUPE_ASSERT(s.start_pos >= 0 && s.start_pos + s.num_tokens <= cfg_.max_seq_len,
                  s.start_pos, s.num_tokens, cfg_.max_seq_len);
    TROUPE_ASSERT(rope0 >= 0 && rope0 + s.num_tokens <= cfg_.max_seq_len, rope0, s.num_tokens, cfg_.max_seq_len);
    TROUPE_ASSERT(static_cast<int64_t>(s.block_table.size()) * kv_.shape().block_size >= s.start_pos + s.num_tokens,
                  s.block_table.size(), s.start_pos, s.num_tokens);
    for (size_t b = 0; b < s.block_table.size(); ++b) {
      table[b] = s.block_table[b].value;
      TROUPE_ASSERT(table[b] < static_cast<uint32_t>(kv_.shape().num_blocks), table[b], kv_.shape().num_blocks);
    }
    const int32_t seen = s.start_pos + s.num_tokens;  // the slots its last token sees
    if (s.tree_parents) TROUPE_ASSERT(s.num_tokens <= max_tree_tokens && s.tree_parents[0] == -1, s.num_tokens);
    const size_t first_token = att_tokens_.size();
    for (int32_t i = 0; i < s.num_tokens; ++i) {
      const int32_t pos = s.start_pos + i;
      attention_token t{pos, table, cfg_.sliding_window > 0 ? std::max(0, pos - cfg_.sliding_window + 1) : 0};
      if (s.window_first && cfg_.sliding_window > 0) {
        TROUPE_ASSERT(s.window_first[i] >= 0 && s.window_first[i] <= pos, s.window_first[i], pos);
        t.first = s.window_first[i];
      }
      if (s.attention_mass && i >= s.num_tokens - attention_mass_rows(s.num_tokens)) {
        t.weights = weights;
        t.weights_stride = seen;
        weights += int64_t{local_heads_} * seen;
      }
      int32_t rope = rope0 + i;
      if (s.tree_parents) {  // its parent's ancestors and itself; one deeper than its parent
        const int32_t up = s.tree_parents[i];
        TROUPE_ASSERT(up < i && (up >= 0 || i == 0), up, i);
        t.tree_first = s.start_pos;
        t.tree_mask = (up < 0 ? 0 : att_tokens_[first_token + static_cast<size_t>(up)].tree_mask) | (uint64_t{1} << i);
        rope = up < 0 ? rope0 : rope_at_[first_token + static_cast<size_t>(up)] + 1;
      }
      att_tokens_.push_back(t);
      rope_at_.push_back(rope);
    }
    if (attention) {
      mass_at_.push_back(s.attention_mass ? mass_at : -1);
      if (s.attention_mass) mass_at += seen;
    }
    table += s.block_table.size();
  }
  TROUPE_ASSERT(static_cast<int32_t>(att_tokens_.size()) == n, att_tokens_.size(), n);

  if (is_first_stage()) {
    for (int32_t t : batch.tokens) TROUPE_ASSERT(t >= 0 && t < cfg_.vocab_size, t, cfg_.vocab_size);
    embedding(model_.weights.token_embedding, batch.tokens.data(), n, hidden, cfg_.dim);
  }
  for (int32_t l = 0; l < num_layers; ++l) {
    run_layer(l, batch, hidden);
    if (attention) add_attention(batch);
  }
  if (attention) {
    // Every shard of a stage sums its own heads; the sums are the stage's after this.
    if (spec_.tp.size > 1) comm_.all_reduce_sum(mass_.data(), static_cast<int64_t>(mass_.size()));
    for (size_t i = 0; i < batch.sequences.size(); ++i) {
      const step_sequence& s = batch.sequences[i];
      if (!s.attention_mass) continue;
      for (int32_t p = 0; p < s.start_pos + s.num_tokens; ++p) s.attention_mass[p] += mass_[mass_at_[i] + p];
    }
  }
  if (head) run_head(batch, hidden, logits);
}

// The layer's softmax weights, summed over heads and tokens into each sequence's slots, in
// a fixed order.
void transformer_shard::add_attention(const step_batch& batch) {
  size_t t = 0;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const step_sequence& s = batch.sequences[i];
    if (!s.attention_mass) {
      t += s.num_tokens;
      continue;
    }
    float* mass = mass_.data() + mass_at_[i];
    for (int32_t j = 0; j < s.num_tokens; ++j, ++t) {
      const attention_token& tok = att_tokens_[t];
      if (!tok.weights) continue;
      for (int32_t h = 0; h < local_heads_; ++h) {
        const float* w = tok.weights + int64_t{h} * tok.weights_stride;
        for (int32_t p = 0; p <= tok.position; ++p) mass[p] += w[p];
      }
    }
  }
}

void transformer_shard::compact(const kv_compaction& c) {
  auto ids = [&](std::span<const block_id> blocks) {
    std::vector<uint32_t> out(blocks.size());
    for (size_t b = 0; b < out.size(); ++b) {
      out[b] = blocks[b].value;
      TROUPE_ASSERT(out[b] < static_cast<uint32_t>(kv_.shape().num_blocks), out[b], kv_.shape().num_blocks);
    }
    return out;
  };
  const std::vector<uint32_t> table = ids(c.block_table);
  const std::vector<uint32_t> to_table = ids(c.target());
  const int32_t bs = kv_.shape().block_size;
  TROUPE_ASSERT(static_cast<int64_t>(to_table.size()) * bs >= static_cast<int64_t>(c.kept.size()), to_table.size(),
                c.kept.size());
  const int64_t slots = static_cast<int64_t>(table.size()) * bs;
  const int32_t half = cfg_.rope_dim / 2, kv_dim = local_kv_heads_ * cfg_.head_dim;
  std::vector<float> k(static_cast<size_t>(kv_dim)), v(static_cast<size_t>(kv_dim)), cs(half), sn(half);
  for (size_t i = 0; i < c.kept.size(); ++i) {
    const int32_t from = c.kept[i], to = static_cast<int32_t>(i);
    TROUPE_ASSERT(from >= to && from < slots && (i == 0 || from > c.kept[i - 1]), i, from, slots);
    if (c.stays(i, bs)) continue;
    if (c.rotate && from != to) {
      // Back by (from - to) positions: the angles of that distance, unscaled (the stored
      // key carries any attention factor already).
      for (int32_t j = 0; j < half; ++j) {
        const float angle = static_cast<float>(to - from) * rope_freqs_[j];
        cs[j] = std::cos(angle);
        sn[j] = std::sin(angle);
      }
    }
    for (int32_t l = 0; l < static_cast<int32_t>(layers_.size()); ++l) {
      const paged_kv_layer layer = kv_.layer(l);
      if (!c.rotate || from == to) {
        paged_kv_copy(layer, table.data(), from, to_table.data(), to);
        continue;
      }
      paged_kv_read(layer, table.data(), from, k.data(), v.data());
      rope(k.data(), local_kv_heads_, cfg_.head_dim, cfg_.rope_dim, cs.data(), sn.data(), cfg_.rope);
      paged_kv_write(layer, to_table.data(), to, k.data(), v.data());
    }
  }
}

void transformer_shard::run_layer(int32_t idx, const step_batch& batch, float* x) {
  const sliced_layer& w = layers_[idx];
  const int32_t n = batch.num_tokens();
  const int32_t dim = cfg_.dim, hd = cfg_.head_dim;
  const int32_t q_dim = local_heads_ * hd, kv_dim = local_kv_heads_ * hd;
  float* xb = grow(xb_, int64_t{n} * dim);
  float* q = grow(q_, int64_t{n} * q_dim);
  float* k = grow(k_, int64_t{n} * kv_dim);
  float* v = grow(v_, int64_t{n} * kv_dim);
  float* att = grow(att_, int64_t{n} * q_dim);
  float* proj = grow(proj_, int64_t{n} * dim);
  const paged_kv_layer cache = kv_.layer(idx);
  const int32_t half = cfg_.rope_dim / 2;

  // Per-token work on the pool when a step has enough of it to pay for waking the pool:
  // `width` values per token (each token's values are computed the same way either way).
  auto per_token = [&](int32_t width, auto&& fn) {
    constexpr int64_t parallel_values = 16384;
    if (int64_t{n} * width < parallel_values) return fn(int64_t{0}, int64_t{n});
    pool_.parallel_for(n, std::max<int64_t>(1, 4096 / width), [&](int64_t tb, int64_t te, int) { fn(tb, te); });
  };

  // Attention block.
  per_token(dim, [&](int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) rmsnorm(xb + t * dim, x + t * dim, w.attn_norm, dim, cfg_.rms_eps);
  });
  const gemm_output qkv[] = {{&w.wq, q, q_dim}, {&w.wk, k, kv_dim}, {&w.wv, v, kv_dim}};
  gemm_multi(xb, dim, n, qkv, 3, pool_);
  // Each token adds its q/k/v biases (when the model has them), rotates and writes its own
  // slot. The int8 and F16 caches convert as they write, which pays for the pool's
  // threads from a few tokens on (hence not per_token's threshold).
  pool_.parallel_for(n, 4, [&](int64_t tb, int64_t te, int) {
    for (int64_t t = tb; t < te; ++t) {
      if (w.bq) {
        for (int32_t i = 0; i < q_dim; ++i) q[t * q_dim + i] += w.bq[i];
        for (int32_t i = 0; i < kv_dim; ++i) k[t * kv_dim + i] += w.bk[i];
        for (int32_t i = 0; i < kv_dim; ++i) v[t * kv_dim + i] += w.bv[i];
      }
      const int32_t rope_pos = rope_at_[t];
      const float* c = rope_cos_.data() + int64_t{rope_pos} * half;
      const float* s = rope_sin_.data() + int64_t{rope_pos} * half;
      rope(q + t * q_dim, local_heads_, hd, cfg_.rope_dim, c, s, cfg_.rope);
      rope(k + t * kv_dim, local_kv_heads_, hd, cfg_.rope_dim, c, s, cfg_.rope);
      paged_kv_write(cache, att_tokens_[t].block_table, att_tokens_[t].position, k + t * kv_dim, v + t * kv_dim);
    }
  });
  paged_attention(q, q_dim, att, q_dim, att_tokens_.data(), n, local_heads_, cache, pool_);
  gemm(att, q_dim, n, w.wo, proj, dim, pool_);
  if (spec_.tp.size > 1) comm_.all_reduce_sum(proj, int64_t{n} * dim);

  // Feed-forward block (SwiGLU), after the attention block's residual.
  const int32_t hid = local_hidden_;
  float* gate = grow(gate_, int64_t{n} * hid);
  float* up = grow(up_, int64_t{n} * hid);
  per_token(2 * dim, [&](int64_t tb, int64_t te) {
    for (int64_t i = tb * dim; i < te * dim; ++i) x[i] += proj[i];
    for (int64_t t = tb; t < te; ++t) rmsnorm(xb + t * dim, x + t * dim, w.ffn_norm, dim, cfg_.rms_eps);
  });
  const gemm_output gate_up[] = {{&w.w1, gate, hid}, {&w.w3, up, hid}};
  gemm_multi(xb, dim, n, gate_up, 2, pool_);
  per_token(hid, [&](int64_t tb, int64_t te) {
    silu_mul(gate + tb * hid, up + tb * hid, static_cast<int32_t>((te - tb) * hid));
  });
  gemm(gate, hid, n, w.w2, proj, dim, pool_);
  if (spec_.tp.size > 1) comm_.all_reduce_sum(proj, int64_t{n} * dim);
  per_token(dim, [&](int64_t tb, int64_t te) {
    for (int64_t i = tb * dim; i < te * dim; ++i) x[i] += proj[i];
  });
}

void transformer_shard::run_head(const step_batch& batch, const float* x, float* logits) {
  const int32_t dim = cfg_.dim;
  const int32_t rows = batch.num_logits();
  float* xb = grow(xb_, int64_t{rows} * dim);
  int32_t token = 0, row = 0;
  for (const auto& s : batch.sequences) {
    token += s.num_tokens;
    TROUPE_ASSERT(s.logit_rows >= 0 && s.logit_rows <= s.num_tokens, s.logit_rows, s.num_tokens);
    for (int32_t t = token - s.logit_rows; t < token; ++t, ++row)
      rmsnorm(xb + int64_t{row} * dim, x + int64_t{t} * dim, model_.weights.final_norm, dim, cfg_.rms_eps);
  }
  gemm(xb, dim, rows, classifier_, logits, cfg_.vocab_size, pool_);
}

}  // namespace troupe
