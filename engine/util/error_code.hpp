// error_code: the kinds of failure troupe's components tell each other, so that a caller
// branches on the kind and never on the words. Between actors they travel as a CAF error
// category (actors/caf/errors.hpp) with the reason beside them; to clients the first three
// are schema/client.capnp's ErrorKind and the OpenAI API's status codes.
#pragma once

#include <cstdint>
#include <string_view>

namespace troupe {

enum class error_code : uint8_t {
  invalid = 1,  // the request or message is wrong, or refused: the sender's to fix
  unavailable,  // nothing can serve it now (no ready replica, recovery): try again later
  internal,     // a component failed: a bug, or a peer that answered nonsense
  not_found,    // no such actor, request or link
  disabled,     // a feature this component does not offer (a CPU stage's device links)
  broken,       // a peer failed during the operation (a collective aborted, a link broke)
};

constexpr std::string_view error_code_name(error_code c) {
  switch (c) {
    case error_code::invalid: return "invalid";
    case error_code::unavailable: return "unavailable";
    case error_code::internal: return "internal";
    case error_code::not_found: return "not_found";
    case error_code::disabled: return "disabled";
    case error_code::broken: return "broken";
  }
  return "unknown";
}

}  // namespace troupe
