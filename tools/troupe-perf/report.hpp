// troupe-perf's results: each printed as a table row when measured, and kept for --json.
#pragma once

#include <string>
#include <vector>

namespace troupe::tools {

struct perf_row {
  std::string name;
  double value = 0;
  std::string unit;
};

// Prints a row (name, value, unit, a note) and keeps it.
void report(const std::string& name, double value, const std::string& unit, const std::string& note = "");
// Keeps a row without printing it (a command that prints its own table).
void keep(const std::string& name, double value, const std::string& unit);
// Every row kept, as a JSON array of {name, value, unit}; false when `path` cannot be written.
bool write_json(const std::string& path);

}  // namespace troupe::tools
