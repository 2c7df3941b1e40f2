// prometheus_text: Prometheus's text exposition format (0.0.4), written in one place for
// every metrics source (the gateways' counters and histograms, the router's replica
// figures, the HTTP server's own): each family's HELP and TYPE lines before its samples,
// label values escaped, numbers in the shortest form that reads back exactly. Plain data,
// one thread at a time.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe {

// A histogram with Prometheus's cumulative buckets, in seconds.
struct histogram {
  std::vector<double> bounds{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  std::vector<uint64_t> counts = std::vector<uint64_t>(bounds.size() + 1, 0);  // per bucket, not cumulative
  double sum = 0;
  uint64_t n = 0;
  void add(double seconds);
};

class prometheus_text {
 public:
  using labels = std::initializer_list<std::pair<std::string_view, std::string_view>>;

  // A family of one unlabelled sample.
  void counter(std::string_view name, std::string_view help, double value);
  void gauge(std::string_view name, std::string_view help, double value);
  // A family's HELP and TYPE lines (type: counter, gauge or histogram); sample() adds its
  // samples after.
  void family(std::string_view name, std::string_view help, std::string_view type);
  void sample(std::string_view name, labels l, double value);
  void histogram(std::string_view name, std::string_view help, const troupe::histogram& h);
  // A histogram's samples alone, under one label (key=value) besides le, for a family of
  // several (family() first, with type histogram).
  void histogram_samples(std::string_view name, const troupe::histogram& h, std::string_view key,
                         std::string_view value);
  // Text another writer made (a remote component's families), as it is.
  void append(std::string_view text) { out_ += text; }

  const std::string& str() const { return out_; }

 private:
  void number(double v);
  std::string out_;
};

}  // namespace troupe
