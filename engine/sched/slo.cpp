#include "engine/sched/slo.hpp"

#include <algorithm>
#include <cmath>

namespace troupe {

const char* slo_outcome_name(slo_outcome o) {
  switch (o) {
    case slo_outcome::met: return "met";
    case slo_outcome::missed: return "missed";
    case slo_outcome::refused: return "refused";
    case slo_outcome::failed: return "failed";
  }
  return "?";
}

slo_outcome slo_judge(const slo_class& c, double ttft_ms, double e2e_ms, uint32_t output_tokens) {
  if (c.ttft_ms > 0 && (ttft_ms < 0 || ttft_ms > c.ttft_ms)) return slo_outcome::missed;
  if (c.tpot_ms > 0 && output_tokens > 1 && (e2e_ms - ttft_ms) / (output_tokens - 1) > c.tpot_ms) return slo_outcome::missed;
  return slo_outcome::met;
}

int32_t slo_class_index(const std::vector<slo_class>& classes, const std::string& name) {
  for (size_t i = 0; i < classes.size(); ++i)
    if (classes[i].name == name) return static_cast<int32_t>(i);
  return -1;
}

std::string slo_class_names(const std::vector<slo_class>& classes) {
  std::string s;
  for (size_t i = 0; i < classes.size(); ++i)
    s += (i == 0 ? "" : i + 1 == classes.size() ? " and " : ", ") + classes[i].name;
  return s;
}

void slo_estimator::observe(int32_t tokens, double ms) {
  if (tokens <= 0 || !(ms >= 0) || !std::isfinite(ms)) return;
  const double x = tokens;
  w_ = w_ * forget + 1;
  x_ = x_ * forget + x;
  y_ = y_ * forget + ms;
  xx_ = xx_ * forget + x * x;
  xy_ = xy_ * forget + x * ms;
  recent_ms_ = steps_ == 0 ? ms : recent_ms_ + recent_weight * (ms - recent_ms_);
  ++steps_;
}

std::optional<slo_estimator::fit> slo_estimator::line() const {
  if (steps_ < min_steps || w_ <= 0) return std::nullopt;
  const double mx = x_ / w_, my = y_ / w_;
  const double var = xx_ / w_ - mx * mx, cov = xy_ / w_ - mx * my;
  fit f;
  // Steps of one size say nothing of the slope: all of the time is the tokens'.
  if (var > 1e-6 * std::max(1.0, mx * mx) && cov > 0) {
    f.per_token_ms = cov / var;
    f.base_ms = std::max(0.0, my - f.per_token_ms * mx);
  } else {
    f.per_token_ms = my / std::max(mx, 1.0);
  }
  return f;
}

std::optional<double> slo_estimator::ttft_ms(int64_t tokens, int32_t max_step_tokens, int32_t decoding) const {
  auto f = line();
  if (!f) return std::nullopt;
  max_step_tokens = std::max(max_step_tokens, 1);
  tokens = std::max<int64_t>(tokens, 1);
  decoding = std::clamp(decoding, 0, max_step_tokens - 1);
  const int64_t chunk = max_step_tokens - decoding;
  const int64_t steps = (tokens + chunk - 1) / chunk;
  const double step = f->base_ms + f->per_token_ms * static_cast<double>(std::min<int64_t>(max_step_tokens, decoding + tokens));
  return static_cast<double>(steps) * step;
}

std::optional<double> slo_estimator::tpot_ms(int32_t decoding) const {
  auto f = line();
  if (!f) return std::nullopt;
  return std::max(f->base_ms + f->per_token_ms * std::max(decoding, 1), recent_ms_);
}

}  // namespace troupe
