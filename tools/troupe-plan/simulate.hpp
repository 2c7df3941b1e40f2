// simulate: the planner's prediction of one deployment under one traffic profile. A
// roofline gives each pipeline stage's time for a step (a smooth maximum of streaming the
// weights and the arithmetic, plus the KV cache attention reads, all-reduces between tensor
// shards and a fixed cost per step); a discrete-event run of troupe's scheduler (steps
// under a token budget, running requests first in admission order and then waiting ones,
// P micro-batches in flight through P stages, each taking its share) turns step times into each request's time
// to first token and time per output token, as troupe-bench measures them.
#pragma once

#include <cstdint>
#include <string>

#include "tools/troupe-plan/hardware.hpp"
#include "tools/troupe-plan/model_cost.hpp"

namespace troupe::plan {

struct layout {
  int tp = 1;        // tensor shards per stage
  int pp = 1;        // pipeline stages per replica
  int replicas = 1;
  int threads = 1;   // cores per shard (a CPU); 1 on a GPU
  int devices() const { return tp * pp * replicas * threads; }
  std::string describe() const;  // "TP=2 PP=1 x3 replicas"
};

// Token counts drawn uniformly from [min, max].
struct length_range {
  int32_t min = 128, max = 128;
  double mean() const { return 0.5 * (min + max); }
};

struct traffic {
  double rate = 0;       // requests/s, Poisson arrivals; 0: a closed loop at `concurrency`
  int concurrency = 8;   // closed loop: clients, each sending its next request when one ends
  int requests = 200;    // requests simulated
  double client_gap_ms = 1;  // closed loop: a client starts, and sends its next request
                             // after a reply, within this long (uniformly), as a
                             // benchmark's threads and connections do
  length_range prompt, output;
  uint64_t seed = 1;
};

struct scheduler_limits {
  int32_t max_step_tokens = 512;
  int32_t max_running = 64;
  int64_t kv_tokens = 0;  // a replica's KV pool in tokens (0: what memory leaves)
};

// One step's rows, as a stage sees them.
struct step_rows {
  int32_t decode = 0;        // requests generating a token
  int32_t prefill = 0;       // prompt tokens in chunks
  int32_t logits = 0;        // rows that need the classifier
  double decode_context = 0;   // positions the decode rows attend over, summed
  double prefill_context = 0;  // positions each prompt token attends over, summed
};

// Milliseconds stage `stage` of `l` takes for a step of `rows` (the step overhead included).
double stage_ms(const model_cost& m, const hardware_profile& h, const layout& l, int stage, const step_rows& rows);
// Layers of stage `stage` when `layers` are split `pp` ways (the first stages take the
// remainder).
int32_t stage_layers(int32_t layers, int pp, int stage);

struct prediction {
  int completed = 0;
  double seconds = 0;  // first arrival to last finish
  double output_tokens_per_s = 0;
  double requests_per_s = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  double tpot_p50_ms = 0, tpot_p99_ms = 0;
  double mean_running = 0;  // requests in a step, averaged over steps
  int32_t peak_running = 0;
};

// Runs `t` against `l` (requests spread evenly over the replicas, as the router's
// least-loaded choice does under a steady load).
prediction simulate(const model_cost& m, const hardware_profile& h, const layout& l, const scheduler_limits& s,
                    const traffic& t);

}  // namespace troupe::plan
