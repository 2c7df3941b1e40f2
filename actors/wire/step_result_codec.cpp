// A step's result on the wire: the tokens chosen, the attention sums and features asked
// for, the tier loads that failed (step_codec.hpp).
#include <string>

#include <capnp/message.h>
#include <kj/exception.h>

#include "actors/wire/frame.hpp"
#include "actors/wire/step_codec.hpp"
#include "schema/step.capnp.h"

namespace troupe::wire {

std::vector<uint8_t> encode_step_result(uint64_t step_id, std::span<const chosen_token> tokens,
                                        std::span<const float> attention, std::span<const request_id> failed_loads,
                                        std::span<const float> features) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::StepResult>();
  root.setStepId(step_id);
  auto samples = root.initSamples(static_cast<unsigned>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i) {
    samples[static_cast<unsigned>(i)].setRequestId(tokens[i].id.value);
    samples[static_cast<unsigned>(i)].setToken(tokens[i].token);
  }
  write_floats([&](unsigned n) { return root.initAttention(n); }, attention);
  write_floats([&](unsigned n) { return root.initFeatures(n); }, features);
  auto failed = root.initFailedLoads(static_cast<unsigned>(failed_loads.size()));
  for (size_t i = 0; i < failed_loads.size(); ++i) failed.set(static_cast<unsigned>(i), failed_loads[i].value);
  return to_bytes(msg);
}

expected<step_result> decode_step_result(std::span<const uint8_t> bytes, int32_t vocab, int32_t max_rows,
                                         int64_t attention, int64_t features) {
  auto frame = frame_reader::parse(
      bytes, frame_limits::flat(static_cast<size_t>(max_rows) * 32 + static_cast<size_t>(attention + features) * 4 +
                                (1 << 12)));
  if (!frame) return frame.err();
  try {
    auto root = (*frame)->root<schema::StepResult>();
    if (root.hasError() && root.getError().size() > 0) return error{std::string("step failed: ") + root.getError().cStr()};
    const auto samples = root.getSamples();
    if (samples.size() > static_cast<unsigned>(max_rows))
      return error{"step result has " + std::to_string(samples.size()) + " tokens; at most " + std::to_string(max_rows)};
    step_result out;
    out.tokens.reserve(samples.size());
    for (const auto s : samples) {
      if (s.getToken() < 0 || s.getToken() >= vocab)
        return error{"step result: token " + std::to_string(s.getToken()) + " is outside the vocabulary"};
      out.tokens.push_back({request_id{s.getRequestId()}, s.getToken()});
    }
    auto sums = read_floats(root.getAttention(), attention, "attention sums");
    if (!sums) return error{"step result carries " + sums.err().message};
    out.attention = std::move(sums).value();
    auto feats = read_floats(root.getFeatures(), features, "feature values");
    if (!feats) return error{"step result carries " + feats.err().message};
    out.features = std::move(feats).value();
    auto failed = read_failed_loads(root.getFailedLoads(), max_rows);
    if (!failed) return error{"step result: " + failed.err().message};
    out.failed_loads = std::move(failed).value();
    return out;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed step result: ") + e.getDescription().cStr()};
  }
}

}  // namespace troupe::wire
