// The step link's frames (actors/step_link.hpp), as both ends read and write them:
// a step is a 20-byte header (magic, the plan's kind and length, the activations' kind
// and length) and the two parts; an answer a 16-byte header (magic, status: 0 a message,
// 1 an error's text; its kind and length) and the part. Internal to the step link's files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "actors/caf/wire_message.hpp"

namespace troupe::step_frames {

constexpr uint32_t frame_magic = 0x4c535254;  // "TRSL" as little-endian bytes
constexpr size_t step_header = 20, answer_header = 16;
constexpr uint32_t max_error_text = 64 * 1024;

inline bool kind_ok(uint32_t k) { return k <= static_cast<uint32_t>(wire_kind::last); }

}  // namespace troupe::step_frames
