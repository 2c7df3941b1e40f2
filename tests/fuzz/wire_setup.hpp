// The setting the wire target decodes in, shared with the seed writer (whose frames must
// fit it): a 300-token vocabulary, a 256-token context, 64 blocks of 16 tokens, hidden
// states of 8 floats.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "actors/wire/draft_codec.hpp"
#include "actors/wire/kv_codec.hpp"
#include "actors/wire/step_codec.hpp"
#include "engine/model/checkpoint_writer.hpp"
#include "engine/sched/scheduler.hpp"

namespace troupe::fuzz {

inline constexpr int32_t vocab = 300, context = 256, dim = 8, block_size = 16;
inline constexpr uint32_t num_blocks = 64;

inline vocabulary small_vocabulary() {
  vocabulary v = synthetic_vocabulary(vocab);
  if (auto e = validate(v)) {
    std::fprintf(stderr, "fuzz: the synthetic vocabulary is invalid: %s\n", e->c_str());
    std::abort();
  }
  return v;
}

inline wire::step_limits step_limits() {
  wire::step_limits l;
  l.vocab = vocab;
  l.context = context;
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.max_step_tokens = 512;
  l.max_chunks = 64;
  return l;
}

inline wire::kv_limits kv_limits() {
  wire::kv_limits l;
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.context = context;
  l.max_claims = 64;
  l.max_releases = 1024;
  l.max_evicting_tokens = 4096;
  return l;
}

inline wire::draft_limits draft_limits() { return {num_blocks, block_size, context, vocab, 64}; }

// An engine scheduler within step_limits().
inline scheduler_config small_scheduler() {
  scheduler_config c;
  c.max_step_tokens = 512;
  c.kv.num_blocks = num_blocks;
  c.kv.block_size = block_size;
  c.max_running = 8;
  c.context = context;
  c.vocab = vocab;
  return c;
}

}  // namespace troupe::fuzz
