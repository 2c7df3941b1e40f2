// SLO classes, and the estimates that let a scheduler refuse early a request it cannot
// serve within its class's targets, rather than serve it late.
//
// A class (the topology's [[class]]) names a time-to-first-token target, a time-per-output-
// token target and a priority. Under classes the scheduler orders its queue by priority,
// then deadline (arrival plus the class's TTFT target), then arrival.
//
// slo_estimator fits a replica's step time as a line in the tokens a step computes,
//
//   step_ms = base_ms + per_token_ms * tokens
//
// by least squares over its recent steps (exponentially forgotten), and predicts from it:
//   ttft(T) = ceil(T / chunk) * (base_ms + per_token_ms * min(max_step_tokens, R + T)),
//             T being the prompt tokens queued before the request and its own, R the
//             requests decoding, whose rows take their part of every step (chunk: what is
//             left of max_step_tokens for prompts);
//   tpot(R) = the larger of base_ms + per_token_ms * R (R the requests decoding together)
//             and the mean of the latest steps (recent_ms: prompt chunks that share the
//             steps with decoding lengthen every token's time, and they keep coming). The
//             mean spans about as many steps as a request decodes (1 / recent_weight), not
//             the last few: those are all prompt chunks whenever a prompt has just come,
//             and a request's tokens meet chunks only at the rate prompts arrive.
// Until it has seen enough steps it predicts nothing (and nothing is refused).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe {

struct slo_class {
  std::string name;
  double ttft_ms = 0;    // time to first token at most (0: no target)
  double tpot_ms = 0;    // time per output token at most (0: no target)
  int32_t priority = 0;  // lower runs first
};

// A request's end as its class's attainment counts it: within both targets, late, refused
// (by SLO admission, or no replica in time), or ended by an error or a cancel (not counted).
enum class slo_outcome : uint8_t { met, missed, refused, failed };
inline constexpr size_t slo_outcomes = 4;
const char* slo_outcome_name(slo_outcome o);
// A request that finished with `output_tokens`, its first after ttft_ms and its last after
// e2e_ms: met, or missed (time per output token: between the first and the last).
slo_outcome slo_judge(const slo_class& c, double ttft_ms, double e2e_ms, uint32_t output_tokens);

// The class named `name` in `classes`, or -1.
int32_t slo_class_index(const std::vector<slo_class>& classes, const std::string& name);
// "a, b and c": the classes' names, for messages.
std::string slo_class_names(const std::vector<slo_class>& classes);

class slo_estimator {
 public:
  static constexpr double forget = 0.97;      // each step's weight against the one before
  static constexpr int32_t min_steps = 8;     // steps seen before anything is predicted
  static constexpr double recent_weight = 1.0 / 32;  // of each step in recent_ms

  // A step that computed `tokens` positions (decode rows and prompt chunks) in `ms`.
  void observe(int32_t tokens, double ms);
  struct fit {
    double base_ms = 0;
    double per_token_ms = 0;
  };
  std::optional<fit> line() const;
  std::optional<double> ttft_ms(int64_t tokens, int32_t max_step_tokens, int32_t decoding = 0) const;
  std::optional<double> tpot_ms(int32_t decoding) const;
  int64_t steps() const { return steps_; }
  double recent_ms() const { return recent_ms_; }

 private:
  double w_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;  // weighted sums
  double recent_ms_ = 0;                             // the latest steps' mean time
  int64_t steps_ = 0;
};

}  // namespace troupe
