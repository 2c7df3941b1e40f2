// Checks for command-line options whose refusals read well (CLI11's NonNegativeNumber, for
// one, states its range up to the largest double: 308 digits).
#pragma once

#include <cmath>
#include <cstdlib>
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

// TOKEN=BIAS, as --logit-bias takes it: a token id and a number in [-100, 100].
inline CLI::Validator token_bias_entry() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const size_t eq = s.find('=');
        char* end = nullptr;
        const long token = eq == std::string::npos ? -1 : std::strtol(s.c_str(), &end, 10);
        if (eq == 0 || eq == std::string::npos || end != s.c_str() + eq || token < 0 || token > INT32_MAX)
          return "'" + s + "' is not TOKEN=BIAS (a token id, '=', a number)";
        const double bias = std::strtod(s.c_str() + eq + 1, &end);
        if (eq + 1 == s.size() || *end != '\0' || !(bias >= -100 && bias <= 100))
          return "'" + s + "': the bias must be a number in [-100, 100]";
        return "";
      },
      "TOKEN=BIAS");
}

// Entries that token_bias_entry() has checked.
inline std::vector<token_bias> parse_token_biases(const std::vector<std::string>& entries) {
  std::vector<token_bias> out;
  for (const auto& e : entries) {
    const size_t eq = e.find('=');
    out.push_back({static_cast<int32_t>(std::strtol(e.c_str(), nullptr, 10)), std::strtof(e.c_str() + eq + 1, nullptr)});
  }
  return out;
}

}  // namespace troupe::tools
