#include "tools/troupe-perf/report.hpp"

#include <cstdio>
#include <fstream>

namespace troupe::tools {

namespace {

std::vector<perf_row>& rows() {
  static std::vector<perf_row> r;
  return r;
}

}  // namespace

void report(const std::string& name, double value, const std::string& unit, const std::string& note) {
  keep(name, value, unit);
  std::printf("%-44s %12.1f %-8s %s\n", name.c_str(), value, unit.c_str(), note.c_str());
  std::fflush(stdout);
}

void keep(const std::string& name, double value, const std::string& unit) { rows().push_back({name, value, unit}); }

bool write_json(const std::string& path) {
  std::ofstream f(path);
  const auto& r = rows();
  f << "[\n";
  for (size_t i = 0; i < r.size(); ++i)
    f << "  {\"name\": \"" << r[i].name << "\", \"value\": " << r[i].value << ", \"unit\": \"" << r[i].unit << "\"}"
      << (i + 1 < r.size() ? ",\n" : "\n");
  f << "]\n";
  return static_cast<bool>(f);
}

}  // namespace troupe::tools
