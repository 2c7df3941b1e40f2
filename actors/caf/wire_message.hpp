// wire_message: the one message type troupe's actors exchange through CAF: an immutable,
// reference-counted Cap'n Proto frame (schema/*.capnp, read through actors/wire/) tagged
// with its kind. Inside a process a send shares the bytes; across processes CAF's
// middleman serializes them once, and a receiver rejects a frame over max_frame_bytes
// before it is used.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <caf/error.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>

namespace troupe {

enum class wire_kind : uint16_t {
  none = 0,
  step_plan = 1,    // schema/step.capnp StepPlan
  step_result = 2,  // StepResult
  activations = 3,  // Activations
  heartbeat = 4,    // schema/control.capnp Heartbeat
  node_health = 5,  // NodeHealth
  kill_actor = 6,   // KillActor
  kv_step = 7,      // schema/kv.capnp KvStep
  kv_grants = 8,    // KvGrants
  nccl_invite = 9,  // schema/control.capnp NcclInvite
  linked_activations = 10,  // Activations without data: they went over a device link
  draft_order = 11,  // schema/draft.capnp DraftOrder
  drafts = 12,       // Drafts
  last = drafts,
};

struct wire_message {
  static constexpr size_t max_frame_bytes = size_t{256} << 20;

  wire_kind kind = wire_kind::none;
  std::shared_ptr<const std::vector<uint8_t>> bytes;

  wire_message() = default;
  wire_message(wire_kind k, std::vector<uint8_t> b)
      : kind(k), bytes(std::make_shared<const std::vector<uint8_t>>(std::move(b))) {}

  size_t size() const { return bytes ? bytes->size() : 0; }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wire_message& x) {
  uint16_t kind = static_cast<uint16_t>(x.kind);
  if constexpr (Inspector::reads_state) {
    std::vector<uint8_t> copy = x.bytes ? *x.bytes : std::vector<uint8_t>{};
    return f(caf::meta::type_name("troupe::wire_message"), kind, copy);
  } else {
    auto staged = std::make_shared<std::vector<uint8_t>>();
    auto done = [&]() -> caf::error {
      if (kind > static_cast<uint16_t>(wire_kind::last) || staged->size() > wire_message::max_frame_bytes)
        return caf::make_error(caf::sec::invalid_argument);
      x.kind = static_cast<wire_kind>(kind);
      x.bytes = std::move(staged);
      return caf::none;
    };
    return f(caf::meta::type_name("troupe::wire_message"), kind, *staged, caf::meta::load_callback(done));
  }
}

}  // namespace troupe
