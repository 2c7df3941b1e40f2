// troupe-perf channel: the KV channel (engine/kv/kv_channel.hpp) on loopback beside raw
// TCP moving the same bytes in the same pieces, alternated in one run: what the framing,
// the records' checksums and copies, the acks and the window cost.
#pragma once

#include <cstddef>

namespace troupe::tools {

struct channel_bench_options {
  size_t total_mib = 1024;  // bytes moved per measurement
  size_t block_kib = 576;   // one KV block's record (syn110m F16: 12 layers x 2 x 16 x 768 x 2 bytes)
};

struct channel_bench_result {
  double channel_gbs = 0;  // the median over the runs
  double raw_gbs = 0;
};

channel_bench_result measure_channel(const channel_bench_options& o, int runs);

}  // namespace troupe::tools
