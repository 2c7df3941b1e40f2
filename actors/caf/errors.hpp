// errors: what actors tell each other when something fails. A troupe error is a CAF error
// of category "troupe" whose code is a troupe::error_code (engine/util/error_code.hpp) and
// whose context is the reason, in words: callers branch on code_of(), never on the words.
// reason_of() gives the words for logs and clients, for CAF's own errors as well (a
// request that got no answer in time, an actor that went away), without CAF's rendering
// syntax.
#pragma once

#include <optional>
#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>

#include "engine/util/error_code.hpp"

CAF_ERROR_CODE_ENUM_2(troupe::error_code, "troupe")

namespace troupe {

inline constexpr caf::atom_value error_category = caf::atom("troupe");

caf::error make_error(error_code code, std::string reason);
// The troupe code of `e`; nothing for an error of another category (CAF's own).
std::optional<error_code> code_of(const caf::error& e);
// `e` in words: a troupe error's reason; for CAF's, what happened ("no answer in time",
// "killed", ...) and any text it carries.
std::string reason_of(const caf::error& e);

}  // namespace troupe
