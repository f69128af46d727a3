// docs/cli.md against the tool: every option `ndsprobe --help` lists has a row (or heading) in the
// reference, and the reference names no option the tool lacks.
#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "test_support.h"

using namespace curv_test;

namespace {

// Every long option (--name) in `text`.
std::set<std::string> long_flags(const std::string& text) {
  static const std::regex flag("--[a-z][a-z0-9-]*");
  std::set<std::string> out;
  for (std::sregex_iterator it(text.begin(), text.end(), flag), end; it != end; ++it) {
    out.insert(it->str());
  }
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The options docs/cli.md documents: those in level-3 headings and in the first cell of table
// rows ("| `--flag` ... | default | meaning |").
std::set<std::string> documented_flags(const std::string& markdown) {
  std::set<std::string> out;
  std::istringstream lines(markdown);
  std::string line;
  while (std::getline(lines, line)) {
    std::string where;
    if (line.rfind("### ", 0) == 0) {
      where = line;
    } else if (line.rfind("|", 0) == 0) {
      const auto end = line.find('|', 1);
      where = line.substr(1, end == std::string::npos ? std::string::npos : end - 1);
    }
    for (const auto& f : long_flags(where)) out.insert(f);
  }
  return out;
}

std::string ndsprobe_help() {
  std::string help;
  const int rc = run_command(tool_path("ndsprobe") + " --help", &help);
  INFO(help);
  REQUIRE(rc == 0);
  return help;
}

const std::string kCliDoc = std::string(CURV_SOURCE_DIR) + "/docs/cli.md";

}  // namespace

TEST_CASE("every option of ndsprobe --help is documented in docs/cli.md", "[docs]") {
  const auto in_help = long_flags(ndsprobe_help());
  REQUIRE(in_help.size() >= 20);  // the help text was really parsed
  const auto documented = documented_flags(read_text(kCliDoc));
  for (const auto& flag : in_help) {
    INFO("option " << flag << " is in --help but has no row or heading in docs/cli.md");
    CHECK(documented.count(flag) == 1);
  }
}

TEST_CASE("docs/cli.md names no option that ndsprobe lacks", "[docs]") {
  const auto in_help = long_flags(ndsprobe_help());
  const std::string doc = read_text(kCliDoc);
  REQUIRE(!documented_flags(doc).empty());
  for (const auto& flag : long_flags(doc)) {
    INFO("docs/cli.md mentions " << flag << ", which ndsprobe --help does not list");
    CHECK(in_help.count(flag) == 1);
  }
}
