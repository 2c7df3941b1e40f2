#include "tools/troupe-perf/serve_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "engine/sample/rng.hpp"

namespace troupe::tools {

namespace {
using clock_type = std::chrono::steady_clock;
double ms(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

serve_result run_serve(llm_engine& engine, const serve_workload& w, int32_t vocab, int32_t bos) {
  rng r(w.seed);
  std::vector<int32_t> prefix{bos};
  while (static_cast<int32_t>(prefix.size()) < w.shared_prefix) prefix.push_back(3 + static_cast<int32_t>(r.next() % (vocab - 3)));
  auto make = [&](int i) {
    request_params p;
    p.prompt = w.shared_prefix > 0 ? prefix : std::vector<int32_t>{bos};
    rng own(w.seed * 1000003 + i);
    while (static_cast<int32_t>(p.prompt.size()) < w.prompt_tokens)
      p.prompt.push_back(3 + static_cast<int32_t>(own.next() % (vocab - 3)));
    p.sampling.temperature = 0.0f;
    p.max_tokens = w.output_tokens;
    p.ignore_eos = true;
    return p;
  };
  struct timing {
    clock_type::time_point start, first, last;
    int64_t tokens = 0;
  };
  std::vector<timing> t(w.num_requests);
  const uint64_t prompt_before = engine.stats().prompt_tokens_computed;
  const uint64_t hits_before = engine.kv().hit_tokens;
  const auto t0 = clock_type::now();
  int next = 0, live = 0, done = 0;
  auto admit = [&] {
    while (live < w.concurrency && next < w.num_requests) {
      t[next].start = clock_type::now();
      if (!engine.add_request(request_id{static_cast<uint64_t>(next)}, make(next))) std::abort();
      ++next;
      ++live;
    }
  };
  admit();
  serve_result res;
  while (done < w.num_requests) {
    const auto outs = engine.step();
    const auto now = clock_type::now();
    for (const auto& o : outs) {
      timing& x = t[o.id.value];
      if (!o.new_tokens.empty()) {
        if (x.tokens == 0)
          x.first = now;
        else
          res.itl_ms.push_back(ms(x.last, now));
        x.last = now;
        x.tokens += static_cast<int64_t>(o.new_tokens.size());
        res.output_tokens += static_cast<int64_t>(o.new_tokens.size());
      }
      if (o.finished) {
        ++done;
        --live;
      }
    }
    admit();
  }
  res.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  res.output_tokens_per_s = res.output_tokens / res.seconds;
  for (const timing& x : t) {
    res.ttft_ms.push_back(ms(x.start, x.first));
    if (x.tokens > 1) res.tpot_ms.push_back(ms(x.first, x.last) / (x.tokens - 1));
  }
  res.prompt_tokens_computed = engine.stats().prompt_tokens_computed - prompt_before;
  res.prefix_hit_tokens = engine.kv().hit_tokens - hits_before;
  return res;
}

}  // namespace troupe::tools
