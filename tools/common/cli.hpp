// Checks for command-line options whose refusals read well: CLI11's NonNegativeNumber
// states its range up to the largest double (308 digits).
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

}  // namespace troupe::tools
