// Checks for command-line options whose refusals read well (CLI11's NonNegativeNumber, for
// one, states its range up to the largest double: 308 digits).
#pragma once

#include <cmath>
#include <climits>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/sample/sampling_params.hpp"

namespace troupe::tools {

// A number of 0 or more.
inline CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || std::isnan(v)) return "'" + s + "' is not a number";
        return v >= 0 ? "" : "must be 0 or more, not " + s;
      },
      "NUMBER >= 0");
}

// HOST:PORT, the port a number up to 65535 (and above 0 unless any_port: 0 asks for a free
// one where a server listens).
inline CLI::Validator host_port(bool any_port = false) {
  return CLI::Validator(
      [any_port](std::string& s) -> std::string {
        const size_t colon = s.rfind(':');
        const bool digits = colon != std::string::npos && colon + 1 < s.size() && s.size() - colon <= 6 &&
                            s.find_first_not_of("0123456789", colon + 1) == std::string::npos;
        if (!digits || colon == 0) return "'" + s + "' is not HOST:PORT";
        const long port = std::strtol(s.c_str() + colon + 1, nullptr, 10);
        if (port > 65535 || (port == 0 && !any_port))
          return "'" + s + "': the port must be " + (any_port ? "0" : "1") + " to 65535";
        return "";
      },
      "HOST:PORT");
}

// TOKEN=BIAS as --logit-bias takes it: a token id, '=', a number (nullopt if s is not).
inline std::optional<token_bias> token_bias_of(const std::string& s) {
  const size_t eq = s.find('=');
  if (eq == 0 || eq == std::string::npos || eq + 1 == s.size()) return std::nullopt;
  char* end = nullptr;
  const long token = std::strtol(s.c_str(), &end, 10);
  if (end != s.c_str() + eq || token < 0 || token > INT32_MAX) return std::nullopt;
  const float bias = std::strtof(s.c_str() + eq + 1, &end);
  if (*end != '\0') return std::nullopt;
  return token_bias{static_cast<int32_t>(token), bias};
}

inline CLI::Validator token_bias_entry() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const auto b = token_bias_of(s);
        if (!b) return "'" + s + "' is not TOKEN=BIAS (a token id, '=', a number)";
        return b->bias >= -100 && b->bias <= 100 ? "" : "'" + s + "': the bias must be a number in [-100, 100]";
      },
      "TOKEN=BIAS");
}

// Entries that token_bias_entry() has checked.
inline std::vector<token_bias> parse_token_biases(const std::vector<std::string>& entries) {
  std::vector<token_bias> out;
  for (const auto& e : entries) out.push_back(*token_bias_of(e));
  return out;
}

}  // namespace troupe::tools
