#include "actors/caf/errors.hpp"

#include <caf/exit_reason.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>

namespace troupe {

caf::error make_error(error_code code, std::string reason) { return caf::error(code, std::move(reason)); }

std::optional<error_code> code_of(const caf::error& e) {
  if (!e || e.category() != error_category) return std::nullopt;
  return static_cast<error_code>(e.code());
}

namespace {

// The strings an error carries, joined.
std::string context_text(const caf::error& e) {
  std::string out;
  const caf::message& m = e.context();
  for (size_t i = 0; i < m.size(); ++i)
    if (m.match_element<std::string>(i)) {
      if (!out.empty()) out += "; ";
      out += m.get_as<std::string>(i);
    }
  return out;
}

std::string sec_words(caf::sec s) {
  switch (s) {
    case caf::sec::request_timeout: return "no answer in time";
    case caf::sec::request_receiver_down: return "the actor asked went away";
    case caf::sec::unexpected_message: return "the actor does not take that message";
    default: break;
  }
  std::string words = to_string(s);
  for (char& c : words)
    if (c == '_') c = ' ';
  return words;
}

std::string exit_words(caf::exit_reason r) {
  switch (r) {
    case caf::exit_reason::normal: return "ended";
    case caf::exit_reason::kill: return "killed";
    case caf::exit_reason::user_shutdown: return "shut down";
    case caf::exit_reason::unhandled_exception: return "an exception ended it";
    case caf::exit_reason::remote_link_unreachable:
    case caf::exit_reason::unreachable: return "its node is unreachable";
    default: break;
  }
  std::string words = to_string(r);
  for (char& c : words)
    if (c == '_') c = ' ';
  return words;
}

}  // namespace

std::string reason_of(const caf::error& e) {
  if (!e) return "no error";
  const std::string context = context_text(e);
  if (e.category() == error_category)
    return context.empty() ? std::string(error_code_name(static_cast<error_code>(e.code()))) : context;
  std::string words;
  if (e.category() == caf::atom("system"))
    words = sec_words(static_cast<caf::sec>(e.code()));
  else if (e.category() == caf::atom("exit"))
    words = exit_words(static_cast<caf::exit_reason>(e.code()));
  else
    words = to_string(e.category()) + " error " + std::to_string(e.code());
  return context.empty() ? words : words + ": " + context;
}

}  // namespace troupe
