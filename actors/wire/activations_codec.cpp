#include "actors/wire/activations_codec.hpp"

#include <cstring>

#include <capnp/message.h>
#include <kj/exception.h>

#include "actors/wire/frame.hpp"
#include "schema/step.capnp.h"

namespace troupe::wire {

std::vector<uint8_t> encode_activations(uint64_t step_id, int32_t num_tokens, int32_t dim, const float* data,
                                        std::span<const float> attention, std::span<const request_id> failed_loads,
                                        std::span<const float> features) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::Activations>();
  root.setStepId(step_id);
  root.setNumTokens(static_cast<uint32_t>(num_tokens));
  root.setDim(static_cast<uint32_t>(dim));
  const size_t bytes = static_cast<size_t>(num_tokens) * dim * sizeof(float);
  auto d = root.initData(static_cast<unsigned>(bytes));
  std::memcpy(d.begin(), data, bytes);
  write_floats([&](unsigned n) { return root.initAttention(n); }, attention);
  write_floats([&](unsigned n) { return root.initFeatures(n); }, features);
  auto failed = root.initFailedLoads(static_cast<unsigned>(failed_loads.size()));
  for (size_t i = 0; i < failed_loads.size(); ++i) failed.set(static_cast<unsigned>(i), failed_loads[i].value);
  return to_bytes(msg);
}

namespace {

// An Activations frame of width `dim` with its data (linked: without it), `attention`
// sums and `features` values.
expected<decoded_activations> decode(std::span<const uint8_t> bytes, int32_t dim, int32_t max_tokens, bool linked,
                                     int64_t attention, int64_t features = 0) {
  frame_limits fl;
  fl.max_bytes = (linked ? 0 : static_cast<size_t>(max_tokens) * dim * 4) + static_cast<size_t>(attention + features) * 4 +
                 static_cast<size_t>(max_tokens) * 8 + 4096;
  fl.traversal_words = fl.max_bytes / 8 + 64;
  fl.nesting = 4;
  auto frame = frame_reader::parse(bytes, fl);
  if (!frame) return frame.err();
  try {
    auto root = (*frame)->root<schema::Activations>();
    decoded_activations out;
    out.step_id = root.getStepId();
    if (root.getDim() != static_cast<uint32_t>(dim))
      return error{"activations of width " + std::to_string(root.getDim()) + "; expected " + std::to_string(dim)};
    if (root.getNumTokens() > static_cast<uint32_t>(max_tokens))
      return error{"activations of " + std::to_string(root.getNumTokens()) + " tokens exceed " + std::to_string(max_tokens)};
    out.num_tokens = static_cast<int32_t>(root.getNumTokens());
    out.dim = dim;
    auto sums = read_floats(root.getAttention(), attention, "attention sums");
    if (!sums) return error{"activations carry " + sums.err().message};
    out.attention = std::move(sums).value();
    auto feats = read_floats(root.getFeatures(), features, "feature values");
    if (!feats) return error{"activations carry " + feats.err().message};
    out.features = std::move(feats).value();
    auto failed = read_failed_loads(root.getFailedLoads(), max_tokens);
    if (!failed) return error{"activations: " + failed.err().message};
    out.failed_loads = std::move(failed).value();
    const auto d = root.getData();
    if (linked) {
      if (d.size() != 0) return error{"activations sent over a device link carry " + std::to_string(d.size()) + " bytes"};
      return out;
    }
    if (d.size() != static_cast<size_t>(out.num_tokens) * dim * 4)
      return error{"activations carry " + std::to_string(d.size()) + " bytes for " + std::to_string(out.num_tokens) +
                   " x " + std::to_string(dim) + " floats"};
    out.data.resize(static_cast<size_t>(out.num_tokens) * dim);
    // (No tokens: an empty vector's data() may be null, which memcpy may not take even
    // for 0 bytes.)
    if (d.size() > 0) std::memcpy(out.data.data(), d.begin(), d.size());
    return out;
  } catch (const kj::Exception& e) {
    return error{std::string("malformed activations: ") + e.getDescription().cStr()};
  }
}

}  // namespace

expected<decoded_activations> decode_activations(std::span<const uint8_t> bytes, int32_t dim, int32_t max_tokens,
                                                 int64_t attention, int64_t features) {
  return decode(bytes, dim, max_tokens, false, attention, features);
}

std::vector<uint8_t> encode_linked_activations(uint64_t step_id, int32_t num_tokens, int32_t dim,
                                               std::span<const float> attention) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::Activations>();
  root.setStepId(step_id);
  root.setNumTokens(static_cast<uint32_t>(num_tokens));
  root.setDim(static_cast<uint32_t>(dim));
  write_floats([&](unsigned n) { return root.initAttention(n); }, attention);
  return to_bytes(msg);
}

expected<decoded_activations> decode_linked_activations(std::span<const uint8_t> bytes, int32_t dim, int32_t max_tokens,
                                                        int64_t attention) {
  return decode(bytes, dim, max_tokens, true, attention);
}

}  // namespace troupe::wire
