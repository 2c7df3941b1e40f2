#include "actors/metrics/prometheus_text.hpp"

#include <doctest/doctest.h>

namespace troupe {

TEST_CASE("prometheus text: HELP and TYPE before the samples, escaped labels, exact numbers") {
  prometheus_text out;
  out.counter("a_total", "Things, counted\\ once\nper line.", 3);
  out.gauge("b", "A level.", 0.25);
  out.family("c", "Labelled.", "gauge");
  out.sample("c", {{"node", "n\"0\\\n"}, {"api", "http"}}, 1e21);
  out.sample("c", {}, -0.5);
  CHECK(out.str() ==
        "# HELP a_total Things, counted\\\\ once\\nper line.\n# TYPE a_total counter\na_total 3\n"
        "# HELP b A level.\n# TYPE b gauge\nb 0.25\n"
        "# HELP c Labelled.\n# TYPE c gauge\nc{node=\"n\\\"0\\\\\\n\",api=\"http\"} 1e+21\nc -0.5\n");
}

TEST_CASE("prometheus text: a histogram's buckets are cumulative and end at +Inf with the count") {
  histogram h;
  h.bounds = {0.1, 1};
  h.counts.assign(3, 0);
  h.add(0.05);
  h.add(0.1);  // on a bound: that bucket
  h.add(0.5);
  h.add(7);
  prometheus_text out;
  out.histogram("lat_seconds", "Latency.", h);
  CHECK(out.str() ==
        "# HELP lat_seconds Latency.\n# TYPE lat_seconds histogram\n"
        "lat_seconds_bucket{le=\"0.1\"} 2\nlat_seconds_bucket{le=\"1\"} 3\nlat_seconds_bucket{le=\"+Inf\"} 4\n"
        "lat_seconds_sum 7.65\nlat_seconds_count 4\n");
}

}  // namespace troupe
