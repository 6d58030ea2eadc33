// The layers run one way: no header includes a header of a later stage. Reads every header's
// include lines, so a change that breaks the order fails here, naming the line.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {

/// Each directory of include/kiln and its stage: a header may include its own directory and
/// any earlier stage, never a later one nor another directory of its own stage.
const std::map<std::string, int> stage_of = {
    {"core", 0},    {"data", 1},     {"ir", 1},    {"ops", 2},  {"autodiff", 3},
    {"nn", 3},      {"passes", 3},   {"train", 4}, {"dist", 4}, {"plan", 5},
    {"runtime", 6}, {"backends", 7}, {"", 8}, // compile(), kiln.hpp at the top
};

/// "passes" for "passes/pipeline.hpp", "" for a header at the top.
std::string directory_of(const std::string& path) {
  const auto slash = path.find('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

/// "passes/pass.hpp" for a line `#include "kiln/passes/pass.hpp"`, else "".
std::string included_kiln_header(const std::string& line) {
  const std::string prefix = "#include \"kiln/";
  const auto first = line.find_first_not_of(" \t");
  if (first == std::string::npos || line.compare(first, prefix.size(), prefix) != 0) return "";
  const auto start = first + prefix.size();
  const auto end = line.find('"', start);
  return end == std::string::npos ? "" : line.substr(start, end - start);
}

} // namespace

TEST_CASE("layers: no header includes a header of a later stage") {
  const std::filesystem::path root = std::filesystem::path(KILN_SOURCE_DIR) / "include" / "kiln";
  int headers = 0, includes = 0;
  std::vector<std::string> violations;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    const std::filesystem::path extension = entry.path().extension();
    if (!entry.is_regular_file() || (extension != ".hpp" && extension != ".cuh")) continue;
    ++headers;
    const std::string header = std::filesystem::relative(entry.path(), root).generic_string();
    const std::string from = directory_of(header);
    REQUIRE_MESSAGE(stage_of.contains(from), "no stage for directory '" << from << "'");
    std::ifstream in(entry.path());
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      const std::string target = included_kiln_header(line);
      if (target.empty()) continue;
      ++includes;
      const std::string to = directory_of(target);
      REQUIRE_MESSAGE(stage_of.contains(to), header << ":" << number << " names '" << to << "'");
      const int a = stage_of.at(from), b = stage_of.at(to);
      if (b > a || (b == a && to != from))
        violations.push_back(header + ":" + std::to_string(number) + " includes kiln/" + target);
    }
  }
  CHECK(headers > 80);
  CHECK(includes > 200);
  for (const std::string& v : violations) FAIL_CHECK(v);
}
