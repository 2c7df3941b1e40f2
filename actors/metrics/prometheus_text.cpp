#include "actors/metrics/prometheus_text.hpp"

#include <charconv>
#include <cmath>

namespace troupe {

void histogram::add(double seconds) {
  size_t i = 0;
  while (i < bounds.size() && seconds > bounds[i]) ++i;
  ++counts[i];
  sum += seconds;
  ++n;
}

void prometheus_text::number(double v) {
  if (std::isnan(v)) {
    out_ += "NaN";
  } else if (std::isinf(v)) {
    out_ += v > 0 ? "+Inf" : "-Inf";
  } else {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest form that reads back exactly
    out_.append(buf, r.ptr);
  }
}

void prometheus_text::family(std::string_view name, std::string_view help, std::string_view type) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  for (char c : help) {  // HELP escapes backslash and newline
    if (c == '\\') out_ += "\\\\";
    else if (c == '\n') out_ += "\\n";
    else out_ += c;
  }
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void prometheus_text::sample(std::string_view name, labels l, double value) {
  out_ += name;
  if (l.size() != 0) {
    out_ += '{';
    bool first = true;
    for (const auto& [key, val] : l) {
      if (!first) out_ += ',';
      first = false;
      out_ += key;
      out_ += "=\"";
      for (char c : val) {  // label values escape backslash, quote and newline
        if (c == '\\') out_ += "\\\\";
        else if (c == '"') out_ += "\\\"";
        else if (c == '\n') out_ += "\\n";
        else out_ += c;
      }
      out_ += '"';
    }
    out_ += '}';
  }
  out_ += ' ';
  number(value);
  out_ += '\n';
}

void prometheus_text::counter(std::string_view name, std::string_view help, double value) {
  family(name, help, "counter");
  sample(name, {}, value);
}

void prometheus_text::gauge(std::string_view name, std::string_view help, double value) {
  family(name, help, "gauge");
  sample(name, {}, value);
}

void prometheus_text::histogram(std::string_view name, std::string_view help, const troupe::histogram& h) {
  family(name, help, "histogram");
  histogram_samples(name, h, {}, {});
}

void prometheus_text::histogram_samples(std::string_view name, const troupe::histogram& h, std::string_view key,
                                        std::string_view value) {
  const std::string bucket = std::string(name) + "_bucket";
  auto one = [&](const std::string& series, std::string_view le, double v) {
    if (key.empty() && le.empty()) sample(series, {}, v);
    else if (key.empty()) sample(series, {{"le", le}}, v);
    else if (le.empty()) sample(series, {{key, value}}, v);
    else sample(series, {{key, value}, {"le", le}}, v);
  };
  uint64_t acc = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    acc += h.counts[i];
    char le[32];
    const auto r = std::to_chars(le, le + sizeof le, h.bounds[i]);
    one(bucket, std::string_view(le, r.ptr - le), static_cast<double>(acc));
  }
  one(bucket, "+Inf", static_cast<double>(h.n));
  one(std::string(name) + "_sum", {}, h.sum);
  one(std::string(name) + "_count", {}, static_cast<double>(h.n));
}

}  // namespace troupe
