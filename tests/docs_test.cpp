// docs/cli.md against the tools: every option `ndsprobe --help` and `curvtrain --help` list has a
// row (or heading) in that tool's section of the reference, and each section names no option its
// tool lacks. The curvtrain section starts at the heading "## curvtrain"; everything before it
// is ndsprobe's. docs/hdf5-schema.md against the declared output tables (output_table.h): each
// table's column list names exactly its declared columns, with their types.
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "curv/analysis/output_table.h"
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

std::string tool_help(const std::string& tool) {
  std::string help;
  const int rc = run_command(tool_path(tool) + " --help", &help);
  INFO(help);
  REQUIRE(rc == 0);
  return help;
}

const std::string kCliDoc = std::string(CURV_SOURCE_DIR) + "/docs/cli.md";

// The part of docs/cli.md that documents `tool`: ndsprobe's before the "## curvtrain" heading,
// curvtrain's from it to the end.
std::string cli_section(const std::string& tool) {
  const std::string doc = read_text(kCliDoc);
  const std::string heading = "\n## curvtrain\n";
  const auto at = doc.find(heading);
  REQUIRE(at != std::string::npos);
  return tool == "curvtrain" ? doc.substr(at + 1) : doc.substr(0, at + 1);
}

void check_every_option_documented(const std::string& tool, size_t min_options) {
  const auto in_help = long_flags(tool_help(tool));
  REQUIRE(in_help.size() >= min_options);  // the help text was really parsed
  const auto documented = documented_flags(cli_section(tool));
  for (const auto& flag : in_help) {
    INFO("option " << flag << " is in " << tool
                   << " --help but has no row or heading in its "
                      "section of docs/cli.md");
    CHECK(documented.count(flag) == 1);
  }
}

void check_no_unknown_option(const std::string& tool) {
  const auto in_help = long_flags(tool_help(tool));
  const std::string section = cli_section(tool);
  REQUIRE(!documented_flags(section).empty());
  for (const auto& flag : long_flags(section)) {
    INFO("the " << tool << " section of docs/cli.md mentions " << flag << ", which " << tool
                << " --help does not list");
    CHECK(in_help.count(flag) == 1);
  }
}

// The cells of a markdown table row, split at the '|' that are not escaped ("\|λ\|").
std::vector<std::string> table_cells(const std::string& row) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '|' && row[i - 1] != '\\') {
      cells.push_back(cell);
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  return cells;
}

// The columns that the first table after the line starting with `anchor` lists: every
// `name` of each row's first cell, with that row's type cell.
std::map<std::string, std::string> documented_columns(const std::string& markdown,
                                                      const std::string& anchor) {
  std::istringstream lines(markdown);
  std::string line;
  bool found = false;
  while (!found && std::getline(lines, line)) found = line.rfind(anchor, 0) == 0;
  INFO("anchor: " << anchor);
  REQUIRE(found);
  while (std::getline(lines, line) && line.rfind("|", 0) != 0) {
  }
  std::getline(lines, line);  // the separator after the header row
  static const std::regex name("`([a-z_0-9]+)`");
  std::map<std::string, std::string> out;
  while (std::getline(lines, line) && line.rfind("|", 0) == 0) {
    const auto cells = table_cells(line);
    REQUIRE(cells.size() >= 2);
    for (std::sregex_iterator it(cells[0].begin(), cells[0].end(), name), end; it != end; ++it) {
      out[(*it)[1].str()] = cells[1];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("docs/hdf5-schema.md lists exactly the declared columns of every output table",
          "[docs]") {
  const std::string doc = read_text(std::string(CURV_SOURCE_DIR) + "/docs/hdf5-schema.md");
  const auto specs = curv::output_table_specs();
  REQUIRE(specs.size() >= 12);
  for (const auto& spec : specs) {
    INFO("table " << spec.name << " (" << spec.doc_anchor << ")");
    const auto documented = documented_columns(doc, spec.doc_anchor);
    std::set<std::string> declared;
    for (const auto& column : spec.columns) {
      declared.insert(column.name);
      INFO("column " << column.name << " is declared but not documented");
      REQUIRE(documented.count(column.name) == 1);
      INFO("its documented type: " << documented.at(column.name));
      CHECK(documented.at(column.name).find(curv::to_string(column.type)) != std::string::npos);
    }
    for (const auto& [name, type] : documented) {
      INFO("column " << name << " is documented but not declared");
      CHECK(declared.count(name) == 1);
    }
  }
}

TEST_CASE("every option of ndsprobe --help is documented in docs/cli.md", "[docs]") {
  check_every_option_documented("ndsprobe", 20);
}

TEST_CASE("docs/cli.md names no option that ndsprobe lacks", "[docs]") {
  check_no_unknown_option("ndsprobe");
}

TEST_CASE("every option of curvtrain --help is documented in docs/cli.md", "[docs]") {
  check_every_option_documented("curvtrain", 20);
}

TEST_CASE("docs/cli.md names no option that curvtrain lacks", "[docs]") {
  check_no_unknown_option("curvtrain");
}
