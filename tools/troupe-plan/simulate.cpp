#include "tools/troupe-plan/simulate.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>
#include <random>
#include <sstream>

#include "tools/common/stats.hpp"

namespace troupe::plan {

namespace {

constexpr double never = std::numeric_limits<double>::infinity();

// The matrix rate at `rows` rows: the decode figure up to 16 rows, the prefill figure from
// 128, log-linear between.
double gflops_at(const rate_point& r, int32_t rows) {
  if (rows <= 16) return r.decode_gflops;
  if (rows >= 128) return r.prefill_gflops;
  const double f = std::log(rows / 16.0) / std::log(8.0);
  return r.decode_gflops * std::pow(r.prefill_gflops / r.decode_gflops, f);
}

double hop_seconds(const hardware_profile& h, const model_cost& m, int32_t rows) {
  return h.net_latency_us * 1e-6 + rows * m.dim * 4.0 / (h.net_gbs * 1e9);
}

struct request {
  double arrival = 0;
  int32_t prompt = 0, output = 0;
  int32_t prefilled = 0, produced = 0;
  int32_t chunk = 0;       // prompt tokens in the step it is in
  bool decoding = false;   // generating a token in the step it is in
  bool in_flight = false;  // in a step not yet back
  double first = -1;
};

struct micro_batch {
  double ready_at = 0;  // when its step comes back (or it may plan, if it has none)
  bool idle = false;    // nothing to plan: waits for an arrival or another's step
  std::vector<int> step;  // the requests in its step
};

struct replica_run {
  std::vector<double> ttft_ms, tpot_ms;
  int64_t output_tokens = 0;
  double first_arrival = never, last_finish = 0;
  double running_sum = 0;
  int64_t steps = 0;
  int32_t peak_running = 0;
};

// One replica as troupe's scheduler runs it: running requests first, in admission order,
// then waiting ones, within the step's token budget; with P micro-batches each plan takes
// its share of the requests (those not in a step already), as the scheduler does.
class replica_sim {
 public:
  replica_sim(const model_cost& m, const hardware_profile& h, const layout& l, const scheduler_limits& s,
              const traffic& t, int requests, int concurrency, double rate, uint64_t seed)
      : m_(m), h_(h), l_(l), s_(s), t_(t), requests_(requests), rng_(seed), mbs_(static_cast<size_t>(l.pp)),
        stage_free_(static_cast<size_t>(l.pp), 0.0) {
    if (rate > 0) {
      std::exponential_distribution<double> gap(rate);
      double at = 0;
      for (int i = 0; i < requests_; ++i) {
        arrive(at);
        at += gap(rng_);
      }
    } else {
      for (int i = 0; i < std::min(concurrency, requests_); ++i) arrive(client_gap());
    }
  }

  replica_run run() {
    while (micro_batch* mb = next_micro_batch()) {
      complete(*mb);
      plan(*mb);
    }
    return out_;
  }

 private:
  void arrive(double at) {
    request r;
    r.arrival = at;
    r.prompt = draw(t_.prompt);
    r.output = std::max(1, draw(t_.output));
    reqs_.push_back(r);
    pending_.push({at, static_cast<int>(reqs_.size()) - 1});
  }

  double client_gap() { return std::uniform_real_distribution<double>(0, t_.client_gap_ms * 1e-3)(rng_); }

  int32_t draw(const length_range& r) {
    return std::uniform_int_distribution<int32_t>(r.min, std::max(r.min, r.max))(rng_);
  }

  // The micro-batch to run next: the earliest ready. Idle ones wake at the next arrival,
  // or just after the next step comes back (it may free room for waiting requests, or
  // bring arrivals in a closed loop), whichever is first.
  micro_batch* next_micro_batch() {
    double back = never;
    for (const micro_batch& mb : mbs_)
      if (!mb.step.empty()) back = std::min(back, mb.ready_at);
    const double arrival = pending_.empty() ? never : pending_.top().first;
    if (back == never && arrival == never && waiting_.empty() && running_.empty()) return nullptr;  // all served
    const double wake = std::min(arrival, back + 1e-9);
    for (micro_batch& mb : mbs_)
      if (mb.idle && wake < never) {
        mb.ready_at = std::max(mb.ready_at, wake);
        mb.idle = false;
      }
    micro_batch* best = nullptr;
    for (micro_batch& mb : mbs_)
      if (!mb.idle && (!best || mb.ready_at < best->ready_at)) best = &mb;
    return best;
  }

  int64_t kv_need(const request& r) const { return int64_t{r.prompt} + r.output; }

  // The step of `mb` comes back: tokens out, prompts advanced, finished requests gone.
  void complete(micro_batch& mb) {
    const double at = mb.ready_at;
    for (int i : mb.step) {
      request& r = reqs_[static_cast<size_t>(i)];
      r.in_flight = false;
      if (r.chunk > 0) {
        r.prefilled += r.chunk;
        if (r.prefilled == r.prompt) {
          r.produced = 1;
          r.first = at;
        }
      } else if (r.decoding) {
        ++r.produced;
      }
      r.chunk = 0;
      r.decoding = false;
      if (r.produced >= r.output) finish(i, at);
    }
    mb.step.clear();
  }

  void plan(micro_batch& mb) {
    const double now = mb.ready_at;
    while (!pending_.empty() && pending_.top().first <= now) {
      waiting_.push_back(pending_.top().second);
      pending_.pop();
    }
    size_t slots = l_.pp > 1 ? std::max<size_t>(1, (running_.size() + waiting_.size() + l_.pp - 1) / l_.pp)
                             : std::numeric_limits<size_t>::max();
    int32_t budget = s_.max_step_tokens;
    step_rows rows;
    auto take = [&](int i) {
      request& r = reqs_[static_cast<size_t>(i)];
      if (r.prefilled == r.prompt) {
        r.decoding = true;
        ++rows.decode;
        ++rows.logits;
        rows.decode_context += r.prompt + r.produced;
        --budget;
      } else {
        r.chunk = std::min(r.prompt - r.prefilled, budget);
        budget -= r.chunk;
        rows.prefill += r.chunk;
        rows.prefill_context += r.chunk * (r.prefilled + 0.5 * r.chunk);
        if (r.prefilled + r.chunk == r.prompt) ++rows.logits;
      }
      r.in_flight = true;
      mb.step.push_back(i);
      --slots;
    };
    for (int i : running_) {
      if (budget <= 0 || slots == 0) break;
      if (!reqs_[static_cast<size_t>(i)].in_flight) take(i);
    }
    const int64_t kv_cap = s_.kv_tokens > 0 ? s_.kv_tokens : std::numeric_limits<int64_t>::max();
    while (budget > 0 && slots > 0 && !waiting_.empty() && running_.size() < static_cast<size_t>(s_.max_running) &&
           kv_used_ + kv_need(reqs_[static_cast<size_t>(waiting_.front())]) <= kv_cap) {
      const int i = waiting_.front();
      waiting_.pop_front();
      kv_used_ += kv_need(reqs_[static_cast<size_t>(i)]);
      running_.push_back(i);
      take(i);
    }
    if (mb.step.empty()) {
      mb.idle = true;
      return;
    }
    // Through the stages: each starts when the step has reached it and it is free.
    double at = now;
    for (int s = 0; s < l_.pp; ++s) {
      if (s > 0) at += hop_seconds(h_, m_, rows.decode + rows.prefill);
      const double start = std::max(at, stage_free_[static_cast<size_t>(s)]);
      at = start + stage_ms(m_, h_, l_, s, rows) * 1e-3;
      stage_free_[static_cast<size_t>(s)] = at;
    }
    if (l_.pp > 1) at += hop_seconds(h_, m_, rows.logits);
    mb.ready_at = at;
    out_.running_sum += static_cast<double>(mb.step.size());
    out_.peak_running = std::max(out_.peak_running, static_cast<int32_t>(running_.size()));
    ++out_.steps;
  }

  void finish(int i, double at) {
    const request& r = reqs_[static_cast<size_t>(i)];
    kv_used_ -= kv_need(r);
    running_.erase(std::find(running_.begin(), running_.end(), i));
    out_.ttft_ms.push_back((r.first - r.arrival) * 1e3);
    if (r.output > 1) out_.tpot_ms.push_back((at - r.first) * 1e3 / (r.output - 1));
    out_.output_tokens += r.output;
    out_.first_arrival = std::min(out_.first_arrival, r.arrival);
    out_.last_finish = std::max(out_.last_finish, at);
    if (static_cast<int>(reqs_.size()) < requests_ && t_.rate <= 0) arrive(at + client_gap());
  }

  const model_cost& m_;
  const hardware_profile& h_;
  const layout& l_;
  const scheduler_limits& s_;
  const traffic& t_;
  int requests_;
  std::mt19937_64 rng_;
  std::vector<request> reqs_;
  using arrival = std::pair<double, int>;
  std::priority_queue<arrival, std::vector<arrival>, std::greater<>> pending_;
  std::deque<int> waiting_;
  std::vector<int> running_;  // admitted, in admission order
  std::vector<micro_batch> mbs_;
  std::vector<double> stage_free_;
  int64_t kv_used_ = 0;
  replica_run out_;
};

}  // namespace

std::string layout::describe() const {
  std::ostringstream os;
  os << "TP=" << tp << " PP=" << pp;
  if (threads > 1) os << ", " << threads << " threads per shard";
  os << ", " << replicas << (replicas == 1 ? " replica" : " replicas");
  return os.str();
}

int32_t stage_layers(int32_t layers, int pp, int stage) {
  return layers / pp + (stage < layers % pp ? 1 : 0);
}

double stage_ms(const model_cost& m, const hardware_profile& h, const layout& l, int stage, const step_rows& rows) {
  const rate_point r = h.rates_for(l.threads);
  const int32_t layers = stage_layers(m.layers, l.pp, stage);
  const bool last = stage == l.pp - 1;
  const int32_t n = rows.decode + rows.prefill;
  const double tp = l.tp;
  const double flops_rate = gflops_at(r, n) * 1e9;
  const double weights = (layers * m.layer_bytes + (last ? m.classifier_bytes : 0)) / tp;
  const double flops = (n * m.layer_flops(layers) + (last ? rows.logits * m.classifier_flops() : 0)) / tp;
  // Streaming and arithmetic overlap, but not perfectly where they are close (a few rows
  // on a CPU): a smooth maximum, within 26% of max() where they are equal, within 4%
  // once one is twice the other.
  const double stream = weights / (r.weight_gbs * 1e9), arithmetic = flops / flops_rate;
  const double matrix = std::cbrt(stream * stream * stream + arithmetic * arithmetic * arithmetic);
  const double attention = rows.decode_context * m.kv_token_layer_bytes * layers / tp / (r.kv_gbs * 1e9) +
                           m.attention_flops(layers, rows.prefill_context) / tp / flops_rate;
  const double all_reduce =
      l.tp > 1 ? 2.0 * layers * (h.link_latency_us * 1e-6 + n * m.dim * 4.0 * 2 * (tp - 1) / tp / (h.link_gbs * 1e9))
               : 0;
  return (matrix + attention + all_reduce) * 1e3 + h.step_overhead_for(l.threads);
}

prediction simulate(const model_cost& m, const hardware_profile& h, const layout& l, const scheduler_limits& s,
                    const traffic& t) {
  std::vector<replica_run> runs;
  for (int i = 0; i < l.replicas; ++i) {
    const int requests = t.requests / l.replicas + (i < t.requests % l.replicas ? 1 : 0);
    const int concurrency = t.concurrency / l.replicas + (i < t.concurrency % l.replicas ? 1 : 0);
    if (requests == 0 || (t.rate <= 0 && concurrency == 0)) continue;
    runs.push_back(replica_sim(m, h, l, s, t, requests, concurrency, t.rate / l.replicas, t.seed + 7919 * i).run());
  }
  prediction p;
  std::vector<double> ttft, tpot;
  double first = never, last = 0, running = 0;
  int64_t tokens = 0, steps = 0;
  for (const replica_run& r : runs) {
    ttft.insert(ttft.end(), r.ttft_ms.begin(), r.ttft_ms.end());
    tpot.insert(tpot.end(), r.tpot_ms.begin(), r.tpot_ms.end());
    first = std::min(first, r.first_arrival);
    last = std::max(last, r.last_finish);
    tokens += r.output_tokens;
    running += r.running_sum;
    steps += r.steps;
    p.peak_running = std::max(p.peak_running, r.peak_running);
  }
  p.completed = static_cast<int>(ttft.size());
  if (p.completed == 0) return p;
  p.seconds = last - first;
  p.output_tokens_per_s = p.seconds > 0 ? tokens / p.seconds : 0;
  p.requests_per_s = p.seconds > 0 ? p.completed / p.seconds : 0;
  p.ttft_p50_ms = tools::percentile(ttft, 50);
  p.ttft_p99_ms = tools::percentile(ttft, 99);
  p.tpot_p50_ms = tools::percentile(tpot, 50);
  p.tpot_p99_ms = tools::percentile(tpot, 99);
  p.mean_running = steps > 0 ? running / steps : 0;
  return p;
}

}  // namespace troupe::plan
