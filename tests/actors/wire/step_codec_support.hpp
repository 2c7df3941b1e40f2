// Helpers of the step codec's tests (step_codec_test.cpp, step_codec_kv_test.cpp): the
// limits a stage decodes under, a hand-built one-chunk plan, an engine scheduler within them.
#pragma once

#include <cstdint>
#include <vector>

#include <capnp/message.h>

#include "actors/wire/frame.hpp"
#include "actors/wire/step_codec.hpp"
#include "engine/sched/scheduler.hpp"
#include "schema/step.capnp.h"

namespace troupe::wire {

inline step_limits limits() {
  step_limits l;
  l.vocab = 512;
  l.context = 512;
  l.num_blocks = 12;
  l.block_size = 4;
  l.max_step_tokens = 64;
  l.max_chunks = 16;
  return l;
}

// A plan message built by hand, one chunk.
inline std::vector<uint8_t> one_chunk(uint64_t step, uint64_t id, int32_t first, std::vector<int32_t> toks,
                                      std::vector<uint32_t> blocks, bool reset, uint64_t session = 0, bool reset_all = false) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::StepPlan>();
  root.setStepId(step);
  root.setSession(session);
  root.setResetAll(reset_all);
  auto c = root.initChunks(1)[0];
  c.setRequestId(id);
  c.setFirst(first);
  auto t = c.initTokens(static_cast<unsigned>(toks.size()));
  for (size_t i = 0; i < toks.size(); ++i) t.set(static_cast<unsigned>(i), toks[i]);
  auto b = c.initNewBlocks(static_cast<unsigned>(blocks.size()));
  for (size_t i = 0; i < blocks.size(); ++i) b.set(static_cast<unsigned>(i), blocks[i]);
  c.setResetTable(reset);
  c.setSample(true);
  return to_bytes(msg);
}

// An engine scheduler within limits(), running up to four requests.
inline scheduler_config small_scheduler() {
  scheduler_config cfg;
  cfg.max_step_tokens = 64;
  cfg.kv.num_blocks = 12;
  cfg.kv.block_size = 4;
  cfg.max_running = 4;
  cfg.context = 512;
  cfg.vocab = 512;
  return cfg;
}

}  // namespace troupe::wire
