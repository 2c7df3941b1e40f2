// A STREAM-like triad (a[i] = b[i] + s * c[i]) over arrays far larger than the last-level
// cache, to measure the memory bandwidth the machine gives this many threads.
#pragma once

#include "kernels/cpu/thread_pool.hpp"

namespace troupe::tools {

struct bandwidth {
  double triad_gbs;  // bytes moved (2 reads + 1 write) per second, best of the runs
  double read_gbs;   // a pure read (sum) over the same arrays
};

bandwidth measure_bandwidth(thread_pool& pool, size_t bytes_per_array, int runs);

}  // namespace troupe::tools
