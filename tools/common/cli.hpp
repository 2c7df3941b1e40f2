// Checks for command-line options whose refusals read well (CLI11's NonNegativeNumber, for
// one, states its range up to the largest double: 308 digits).
#pragma once

#include <cmath>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

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

}  // namespace troupe::tools
