// Tests of the HDF5 file layer: round trips of every dataset/attribute kind, tables, the atomic
// commit, error messages, and interoperability with h5py in both directions.
#include "curv/io/h5_file.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "curv/core/error.h"
#include "test_support.h"

namespace {

using curv::H5Reader;
using curv::H5Writer;
using curv::Table;
using curv_test::TempDir;

const double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The contents check_h5.py expects; keep the two in step.
void fill_fixture(H5Writer& w) {
  w.attribute("/", "version", 3);
  w.attribute("/", "tool", "ndsprobe");
  w.dataset("/runs/adamw/step_100/blocks/nds", std::vector<double>{0.5, -1.25, kNaN, 1e300});
  w.dataset("/runs/adamw/matrix", std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  w.dataset("/runs/adamw/ids", std::vector<int64_t>{-3, 0, std::numeric_limits<int64_t>::max()});
  w.dataset("/runs/adamw/names",
            std::vector<std::string>{"alpha", "", "\xc3\xa9t\xc3\xa9 \xe2\x88\x87"});
  w.dataset("/empty/doubles", std::vector<double>{});
  w.dataset("/empty/strings", std::vector<std::string>{});
  w.dataset("/empty/matrix", std::vector<int64_t>{}, {0, 4});
  std::vector<double> big(5000 * 3);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 0.001 * static_cast<double>(i);
  w.dataset("/big", big, {5000, 3});
  w.attribute("/runs/adamw", "lr", 1e-3);
  w.attribute("/runs/adamw", "steps", int64_t{100});
  w.attribute("/runs/adamw", "eigs", std::vector<double>{3.5, kNaN});
  w.attribute("/runs/adamw", "blocks", std::vector<std::string>{"conv1", "fc\xc3\xa9"});
  w.attribute("/runs/adamw/matrix", "unit", "\xce\xbb");
  Table t;
  t.add_column("step", std::vector<int64_t>{100, 100, 200});
  t.add_column("block", std::vector<std::string>{"conv1", "fc", "conv1"});
  t.add_column("nds", std::vector<double>{0.1, kNaN, 0.3});
  w.table("/results", t);
}

void write_fixture(const std::string& path) {
  H5Writer w(path);
  fill_fixture(w);
  w.commit();
}

// The fixture plus every attribute kind on groups and datasets, empty and one-element vector
// attributes, and empty groups: what H5Writer::load must carry over.
void write_rich_fixture(const std::string& path) {
  H5Writer w(path);
  fill_fixture(w);
  w.attribute("/runs/adamw/ids", "scale", 0.5);
  w.attribute("/runs/adamw/ids", "offset", int64_t{-7});
  w.attribute("/runs/adamw/ids", "unit", "count");
  w.attribute("/runs/adamw/ids", "range", std::vector<double>{-3, 1e18});
  w.attribute("/runs/adamw/ids", "tags", std::vector<std::string>{"a", "", "\xc3\xa9"});
  w.attribute("/runs/adamw/names", "one", std::vector<double>{kNaN});
  w.attribute("/runs/adamw/names", "one_name", std::vector<std::string>{"only"});
  w.attribute("/attrs", "none", std::vector<double>{});
  w.attribute("/attrs", "no_names", std::vector<std::string>{});
  w.attribute("/attrs", "empty", "");
  w.attribute("/attrs", "inf", -std::numeric_limits<double>::infinity());
  w.attribute("/attrs", "min", std::numeric_limits<int64_t>::min());
  w.group("/empty/group/below");
  w.dataset("/deep/a/b/c/d", std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  w.commit();
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += "'" + p + "' ";
  return out;
}

template <typename T>
std::string join_numbers(const std::vector<T>& values) {
  std::string out;
  char buffer[64];
  for (T v : values) {
    if constexpr (std::is_same_v<T, double>) {
      std::snprintf(buffer, sizeof buffer, "%.17g ", v);
    } else {
      std::snprintf(buffer, sizeof buffer, "%lld ", static_cast<long long>(v));
    }
    out += buffer;
  }
  return out;
}

// A text dump of everything H5Reader sees below `path`: groups, datasets with type, shape and
// values, and attributes with values, in sorted order.
void dump(const H5Reader& r, const std::string& path, std::string& out) {
  for (const auto& name : r.attribute_names(path)) {
    out += path + " @" + name + " = ";
    try {
      out += "s " + join(r.attribute_strings(path, name));
    } catch (const curv::FormatError&) {
      try {
        out += "i " + std::to_string(r.attribute_int(path, name));
      } catch (const curv::FormatError&) {
        out += "d " + join_numbers(r.attribute_doubles(path, name));
      }
    }
    out += "\n";
  }
  if (r.is_dataset(path)) {
    std::vector<uint64_t> dims;
    try {
      auto values = r.int64s(path, &dims);
      out += path + " int64 " + join_numbers(dims) + ": " + join_numbers(values) + "\n";
    } catch (const curv::FormatError&) {
      try {
        auto values = r.doubles(path, &dims);
        out += path + " double " + join_numbers(dims) + ": " + join_numbers(values) + "\n";
      } catch (const curv::FormatError&) {
        out += path + " strings: " + join(r.strings(path)) + "\n";
      }
    }
    return;
  }
  out += path + " group\n";
  for (const auto& child : r.children(path)) dump(r, (path == "/" ? "" : path) + "/" + child, out);
}

std::string dump(const std::string& file) {
  std::string out;
  dump(H5Reader(file), "/", out);
  return out;
}

}  // namespace

TEST_CASE("H5 datasets and attributes round trip", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("round.h5");
  write_fixture(path);
  H5Reader r(path);
  CHECK(r.path() == path);

  auto nds = r.doubles("/runs/adamw/step_100/blocks/nds");
  REQUIRE(nds.size() == 4);
  CHECK(nds[0] == 0.5);
  CHECK(nds[1] == -1.25);
  CHECK(std::isnan(nds[2]));
  CHECK(nds[3] == 1e300);

  std::vector<uint64_t> dims;
  CHECK(r.doubles("/runs/adamw/matrix", &dims) == std::vector<double>{1, 2, 3, 4, 5, 6});
  CHECK(dims == std::vector<uint64_t>{2, 3});
  CHECK(r.int64s("/runs/adamw/ids", &dims) ==
        std::vector<int64_t>{-3, 0, std::numeric_limits<int64_t>::max()});
  CHECK(dims == std::vector<uint64_t>{3});
  // doubles() converts integer datasets.
  CHECK(r.doubles("/runs/adamw/ids")[0] == -3.0);
  CHECK(r.strings("/runs/adamw/names") ==
        std::vector<std::string>{"alpha", "", "\xc3\xa9t\xc3\xa9 \xe2\x88\x87"});

  CHECK(r.doubles("/empty/doubles", &dims).empty());
  CHECK(dims == std::vector<uint64_t>{0});
  CHECK(r.strings("/empty/strings").empty());
  CHECK(r.int64s("/empty/matrix", &dims).empty());
  CHECK(dims == std::vector<uint64_t>{0, 4});

  auto big = r.doubles("/big", &dims);
  CHECK(dims == std::vector<uint64_t>{5000, 3});
  REQUIRE(big.size() == 15000);
  CHECK(big[14999] == 0.001 * 14999);

  CHECK(r.attribute_int("/", "version") == 3);
  CHECK(r.attribute_string("/", "tool") == "ndsprobe");
  CHECK(r.attribute_double("/runs/adamw", "lr") == 1e-3);
  CHECK(r.attribute_int("/runs/adamw", "steps") == 100);
  CHECK(r.attribute_double("/runs/adamw", "steps") == 100.0);
  auto eigs = r.attribute_doubles("/runs/adamw", "eigs");
  REQUIRE(eigs.size() == 2);
  CHECK(eigs[0] == 3.5);
  CHECK(std::isnan(eigs[1]));
  CHECK(r.attribute_strings("/runs/adamw", "blocks") ==
        std::vector<std::string>{"conv1", "fc\xc3\xa9"});
  CHECK(r.attribute_string("runs/adamw/matrix", "unit") == "\xce\xbb");
  CHECK(r.has_attribute("/runs/adamw", "lr"));
  CHECK_FALSE(r.has_attribute("/runs/adamw", "momentum"));
  CHECK_FALSE(r.has_attribute("/nowhere", "lr"));
}

TEST_CASE("H5 large and empty attributes and replaced values", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("attrs.h5");
  H5Writer w(path);
  std::vector<double> many(20000, 0.25);  // over the 64 KB compact attribute limit
  w.attribute("/g", "many", many);
  w.attribute("/g", "none", std::vector<double>{});
  w.attribute("/g", "no_names", std::vector<std::string>{});
  w.attribute("/g", "empty", "");
  w.attribute("/g", "flag", true);
  w.attribute("/g", "count", size_t{7});
  w.dataset("/g/d", std::vector<double>{1});
  w.dataset("/g/d", std::vector<int64_t>{4, 5});  // replaces
  w.attribute("/g", "count", 8);                  // replaces
  w.commit();
  H5Reader r(path);
  CHECK(r.attribute_doubles("/g", "many") == many);
  CHECK(r.attribute_doubles("/g", "none").empty());
  CHECK(r.attribute_strings("/g", "no_names").empty());
  CHECK(r.attribute_string("/g", "empty").empty());
  CHECK(r.attribute_int("/g", "flag") == 1);
  CHECK(r.attribute_int("/g", "count") == 8);
  CHECK(r.int64s("/g/d") == std::vector<int64_t>{4, 5});
}

TEST_CASE("H5 groups with exists and sorted children", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("groups.h5");
  H5Writer w(path);
  w.group("/top/empty");
  for (const char* name : {"b", "a", "B", "c10", "c2"}) {
    w.dataset(std::string("/top/") + name, std::vector<double>{1.0});
  }
  w.group("/top/zz/deeper/deepest");
  w.commit();
  H5Reader r(path);
  CHECK(r.children("/") == std::vector<std::string>{"top"});
  CHECK(r.children("/top") == std::vector<std::string>{"B", "a", "b", "c10", "c2", "empty", "zz"});
  CHECK(r.children("/top/empty").empty());
  CHECK(r.exists("/"));
  CHECK(r.exists("/top/zz/deeper/deepest"));
  CHECK(r.exists("top//a/"));
  CHECK_FALSE(r.exists("/top/missing"));
  CHECK_FALSE(r.exists("/top/a/below_a_dataset"));
  CHECK_FALSE(r.exists("/nothing/at/all"));
  CHECK(r.is_group("/top/empty"));
  CHECK_FALSE(r.is_group("/top/a"));
  CHECK(r.is_dataset("/top/a"));
  CHECK_FALSE(r.is_dataset("/top"));
  CHECK_THROWS_AS(r.children("/top/a"), curv::FormatError);
  CHECK_THROWS_WITH(r.children("/top/nope"), Catch::Contains("/top/nope") && Catch::Contains(path));
}

TEST_CASE("H5 tables round trip and Table rules", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("table.h5");
  Table rows;
  rows.add_column("step", std::vector<int64_t>{1, 2});
  rows.add_column("name", std::vector<std::string>{"x", "\xc3\xbf"});
  rows.add_column("value", std::vector<double>{0.5, kNaN});
  Table all;
  all.append_rows(rows);
  all.append_rows(rows);
  CHECK(all.num_rows() == 4);
  CHECK(all.int64s("step") == std::vector<int64_t>{1, 2, 1, 2});

  CHECK_THROWS_AS(rows.add_column("step", std::vector<double>{1, 2}), curv::InvalidArgument);
  CHECK_THROWS_AS(rows.add_column("short", std::vector<double>{1}), curv::InvalidArgument);
  CHECK_THROWS_AS(rows.add_column("a/b", std::vector<double>{1, 2}), curv::InvalidArgument);
  CHECK_THROWS_WITH(rows.doubles("step"), Catch::Contains("step"));
  CHECK_THROWS_WITH(rows.column("missing"), Catch::Contains("missing"));
  Table other;
  other.add_column("step", std::vector<double>{1});
  CHECK_THROWS_AS(all.append_rows(other), curv::InvalidArgument);

  H5Writer w(path);
  Table old;
  old.add_column("stale", std::vector<double>{9});
  w.table("/results", old);
  w.attribute("/results", "note", "kept");
  w.table("/results", all);  // replaces the stale column
  Table empty;
  empty.add_column("a", std::vector<double>{});
  empty.add_column("b", std::vector<std::string>{});
  w.table("/empty_table", empty);
  w.table("/no_columns", Table{});
  w.commit();

  H5Reader r(path);
  CHECK(r.attribute_strings("/results", "columns") ==
        std::vector<std::string>{"step", "name", "value"});
  CHECK(r.attribute_string("/results", "note") == "kept");
  CHECK_FALSE(r.exists("/results/stale"));
  Table back = r.table("/results");
  CHECK(back.names() == all.names());
  CHECK(back.num_rows() == 4);
  CHECK(back.int64s("step") == all.int64s("step"));
  CHECK(back.strings("name") == all.strings("name"));
  CHECK(back.doubles("value")[0] == 0.5);
  CHECK(std::isnan(back.doubles("value")[3]));
  Table back_empty = r.table("/empty_table");
  CHECK(back_empty.num_columns() == 2);
  CHECK(back_empty.num_rows() == 0);
  CHECK(r.table("/no_columns").num_columns() == 0);
  CHECK_THROWS_WITH(r.table("/"), Catch::Contains("columns") && Catch::Contains(path));
}

TEST_CASE("H5Writer rejects inconsistent descriptions", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("never_written.h5");
  H5Writer w(path);
  CHECK_THROWS_AS(w.dataset("/m", std::vector<double>{1, 2, 3}, {2, 2}), curv::InvalidArgument);
  CHECK_THROWS_WITH(w.dataset("/m", std::vector<double>{1, 2, 3}, {2, 2}),
                    Catch::Contains("/m") && Catch::Contains("never_written.h5"));
  CHECK_THROWS_AS(w.dataset("/", std::vector<double>{1}), curv::InvalidArgument);
  CHECK_THROWS_AS(w.dataset("/a/../b", std::vector<double>{1}), curv::InvalidArgument);
  w.dataset("/d", std::vector<double>{1});
  CHECK_THROWS_WITH(w.dataset("/d/e", std::vector<double>{1}), Catch::Contains("/d"));
  CHECK_THROWS_AS(w.group("/d"), curv::InvalidArgument);
  CHECK_THROWS_AS(w.group("/d/x"), curv::InvalidArgument);
  CHECK_THROWS_AS(w.attribute("/d", "", 1.0), curv::InvalidArgument);
  w.attribute("/g", "x", 1.0);
  CHECK_THROWS_AS(w.dataset("/g", std::vector<double>{1}), curv::InvalidArgument);
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("H5 commit is atomic and failures leave the old file intact", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("results.h5");
  {
    H5Writer w(path);
    w.dataset("/x", std::vector<double>{1, 2, 3});
    w.commit();
  }
  const std::string good = slurp(path);

  SECTION("an exception before commit touches nothing") {
    try {
      H5Writer w(path);
      w.dataset("/x", std::vector<double>{4, 5, 6});
      throw std::runtime_error("killed mid-way");
    } catch (const std::runtime_error&) {
    }
    CHECK(slurp(path) == good);
    CHECK(H5Reader(path).doubles("/x") == std::vector<double>{1, 2, 3});
  }
  SECTION("a commit into a missing directory throws naming the path") {
    const std::string bad = dir.file("no/such/dir/results.h5");
    H5Writer w(bad);
    w.dataset("/x", std::vector<double>{1});
    CHECK_THROWS_AS(w.commit(), curv::Error);
    CHECK_THROWS_WITH(w.commit(), Catch::Contains(bad));
    CHECK_FALSE(std::filesystem::exists(bad + ".tmp"));
  }
  SECTION("a failed rename keeps the target and removes the tmp file") {
    const std::string target = dir.file("is_a_dir.h5");
    std::filesystem::create_directory(target);
    std::filesystem::create_directory(target + "/keep");
    H5Writer w(target);
    w.dataset("/x", std::vector<double>{1});
    CHECK_THROWS_WITH(w.commit(), Catch::Contains(target));
    CHECK(std::filesystem::is_directory(target + "/keep"));
    CHECK_FALSE(std::filesystem::exists(target + ".tmp"));
  }
  SECTION("a later commit replaces the file and leaves no tmp file") {
    H5Writer w(path);
    w.dataset("/x", std::vector<double>{7});
    w.commit();
    CHECK(H5Reader(path).doubles("/x") == std::vector<double>{7});
    w.dataset("/y", std::vector<int64_t>{8});  // the same writer commits again, whole
    w.commit();
    H5Reader r(path);
    CHECK(r.doubles("/x") == std::vector<double>{7});
    CHECK(r.int64s("/y") == std::vector<int64_t>{8});
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  }
  SECTION("a stale tmp file from a killed run is overwritten") {
    std::ofstream(path + ".tmp") << "garbage";
    H5Writer w(path);
    w.dataset("/z", std::vector<double>{1});
    w.commit();
    CHECK(H5Reader(path).exists("/z"));
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  }
}

TEST_CASE("H5Reader errors name the file and the object", "[h5]") {
  TempDir dir;
  const std::string missing = dir.file("missing.h5");
  CHECK_THROWS_AS(H5Reader(missing), curv::FormatError);
  CHECK_THROWS_WITH(H5Reader(missing), Catch::Contains(missing));

  const std::string text = dir.file("text.h5");
  std::ofstream(text) << "this is not an HDF5 file\n";
  CHECK_THROWS_AS(H5Reader(text), curv::FormatError);
  CHECK_THROWS_WITH(H5Reader(text), Catch::Contains(text) && Catch::Contains("not an HDF5"));
  CHECK_THROWS_AS(H5Reader(dir.path()), curv::FormatError);

  const std::string path = dir.file("ok.h5");
  write_fixture(path);
  H5Reader r(path);
  CHECK_THROWS_AS(r.doubles("/runs/adamw/nope"), curv::FormatError);
  CHECK_THROWS_WITH(r.doubles("/runs/adamw/nope"),
                    Catch::Contains("/runs/adamw/nope") && Catch::Contains(path));
  CHECK_THROWS_WITH(r.doubles("/runs/adamw"), Catch::Contains("not a dataset"));
  CHECK_THROWS_WITH(r.int64s("/runs/adamw/matrix"), Catch::Contains("/runs/adamw/matrix"));
  CHECK_THROWS_WITH(r.doubles("/runs/adamw/names"), Catch::Contains("strings"));
  CHECK_THROWS_WITH(r.strings("/runs/adamw/ids"), Catch::Contains("/runs/adamw/ids"));
  CHECK_THROWS_WITH(r.attribute_double("/runs/adamw", "nope"),
                    Catch::Contains("/runs/adamw") && Catch::Contains("'nope'"));
  CHECK_THROWS_WITH(r.attribute_double("/gone", "lr"), Catch::Contains("/gone"));
  CHECK_THROWS_WITH(r.attribute_double("/runs/adamw", "eigs"), Catch::Contains("2 elements"));
  CHECK_THROWS_WITH(r.attribute_int("/runs/adamw", "lr"), Catch::Contains("'lr'"));
  CHECK_THROWS_WITH(r.attribute_string("/runs/adamw", "lr"), Catch::Contains("'lr'"));
}

TEST_CASE("h5py reads what H5Writer wrote", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("for_python.h5");
  write_fixture(path);
  curv_test::run_python("check_h5.py", {"check", path});
}

// The values `check_h5.py write` puts in its file, whether read directly or after a load and
// commit by H5Writer.
static void check_h5py_fixture(const H5Reader& r) {
  std::vector<uint64_t> dims;
  CHECK(r.doubles("/f32", &dims) == std::vector<double>{0.5, 1.5, -2.0});
  CHECK(r.int64s("/i32") == std::vector<int64_t>{-1, 2, 3});
  CHECK(r.int64s("/u8") == std::vector<int64_t>{0, 255});
  CHECK(r.doubles("/scalar", &dims) == std::vector<double>{2.5});
  CHECK(dims.empty());  // a scalar dataset stays scalar
  CHECK(r.strings("/fixed") == std::vector<std::string>{"ab", "c", ""});
  CHECK(r.strings("/vlen") == std::vector<std::string>{"x", "\xc3\xa9", ""});
  CHECK(r.attribute_string("/", "fixed_attr") == "hello");
  CHECK(r.attribute_string("/", "str_attr") == "w\xc3\xb6rld");
  CHECK(r.attribute_int("/", "int_attr") == 42);
  CHECK(r.attribute_double("/", "float_attr") == 0.25);
  CHECK(r.attribute_doubles("/", "array_attr") == std::vector<double>{1, 2});
  CHECK(r.attribute_strings("/", "names_attr") == std::vector<std::string>{"p", "qq"});
}

TEST_CASE("H5Reader reads what h5py wrote", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("from_python.h5");
  curv_test::run_python("check_h5.py", {"write", path});
  check_h5py_fixture(H5Reader(path));
}

TEST_CASE("H5Reader lists attribute names", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("names.h5");
  write_fixture(path);
  H5Reader r(path);
  CHECK(r.attribute_names("/runs/adamw") ==
        std::vector<std::string>{"blocks", "eigs", "lr", "steps"});
  CHECK(r.attribute_names("/") == std::vector<std::string>{"tool", "version"});
  CHECK(r.attribute_names("runs/adamw/matrix/") == std::vector<std::string>{"unit"});
  CHECK(r.attribute_names("/results") == std::vector<std::string>{"columns"});
  CHECK(r.attribute_names("/empty/doubles").empty());
  CHECK(r.attribute_names("/runs").empty());
  CURV_CHECK_THROWS(r.attribute_names("/runs/gone"), curv::FormatError,
                    Catch::Contains("/runs/gone") && Catch::Contains(path));
}

TEST_CASE("H5Writer::load then commit reproduces the file", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("rich.h5");
  const std::string original = dir.file("original.h5");
  write_rich_fixture(path);
  std::filesystem::copy_file(path, original);
  const std::string before = dump(path);
  CHECK(before.find("/deep/a/b/c/d int64 2 2 2 : 1 2 3 4 5 6 7 8") != std::string::npos);
  CHECK(before.find("/empty/group/below group") != std::string::npos);

  H5Writer w = H5Writer::load(path);
  CHECK(w.path() == path);
  CHECK(w.exists("/runs/adamw/step_100/blocks/nds"));
  CHECK(w.exists("/empty/group/below"));
  w.commit();
  CHECK(dump(path) == before);
  // h5py compares dtypes, shapes (scalar vs one-element attributes), values and storage.
  curv_test::run_python("check_h5.py", {"same", original, path});
  curv_test::run_python("check_h5.py", {"check", path});
  H5Reader r(path);
  CHECK(r.table("/results").names() == std::vector<std::string>{"step", "block", "nds"});
  CHECK(r.attribute_int("/attrs", "min") == std::numeric_limits<int64_t>::min());

  // A second load of the rewritten file changes nothing either.
  H5Writer::load(path).commit();
  curv_test::run_python("check_h5.py", {"same", original, path});
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_CASE("H5Writer::load of an h5py file converts to H5Writer's types", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("from_python.h5");
  curv_test::run_python("check_h5.py", {"write", path});
  H5Writer::load(path).commit();
  check_h5py_fixture(H5Reader(path));
}

TEST_CASE("H5Writer::load then additions keep old and new content", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("resume.h5");
  write_fixture(path);
  {
    H5Writer w = H5Writer::load(path);
    w.dataset("/runs/sgd/step_100/blocks/nds", std::vector<double>{0.75});
    w.attribute("/runs/sgd", "lr", 0.1);
    w.attribute("/", "version", 4);  // replaces
    Table more;
    more.add_column("step", std::vector<int64_t>{300});
    more.add_column("block", std::vector<std::string>{"fc"});
    more.add_column("nds", std::vector<double>{0.5});
    Table all = H5Reader(path).table("/results");
    all.append_rows(more);
    w.table("/results", all);
    w.commit();
  }
  H5Reader r(path);
  CHECK(r.children("/runs") == std::vector<std::string>{"adamw", "sgd"});
  CHECK(r.doubles("/runs/sgd/step_100/blocks/nds") == std::vector<double>{0.75});
  CHECK(r.attribute_double("/runs/sgd", "lr") == 0.1);
  CHECK(r.attribute_int("/", "version") == 4);
  CHECK(r.attribute_string("/", "tool") == "ndsprobe");
  CHECK(r.doubles("/runs/adamw/step_100/blocks/nds")[3] == 1e300);
  CHECK(r.strings("/runs/adamw/names")[2] == "\xc3\xa9t\xc3\xa9 \xe2\x88\x87");
  CHECK(r.attribute_strings("/runs/adamw", "blocks") ==
        std::vector<std::string>{"conv1", "fc\xc3\xa9"});
  std::vector<uint64_t> dims;
  CHECK(r.int64s("/empty/matrix", &dims).empty());
  CHECK(dims == std::vector<uint64_t>{0, 4});
  Table back = r.table("/results");
  CHECK(back.num_rows() == 4);
  CHECK(back.int64s("step") == std::vector<int64_t>{100, 100, 200, 300});
  CHECK(back.strings("block")[3] == "fc");
}

TEST_CASE("H5Writer exists and remove edit the description", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("edit.h5");
  write_fixture(path);
  H5Writer w = H5Writer::load(path);
  CHECK(w.exists("/"));
  CHECK(w.exists("/runs/adamw"));
  CHECK(w.exists("runs//adamw/matrix/"));
  CHECK_FALSE(w.exists("/runs/sgd"));
  CHECK_FALSE(w.exists("/runs/adamw/matrix/below"));
  CHECK_THROWS_AS(w.exists("/runs/.."), curv::InvalidArgument);

  w.remove("/runs/adamw/step_100");  // a group subtree
  w.remove("/runs/adamw/matrix");    // a dataset with an attribute
  w.remove("/runs/missing/deeper");  // absent: nothing happens
  w.remove("/runs/adamw/ids/below");
  CHECK_FALSE(w.exists("/runs/adamw/step_100"));
  CHECK_FALSE(w.exists("/runs/adamw/step_100/blocks/nds"));
  CHECK_FALSE(w.exists("/runs/adamw/matrix"));
  CHECK(w.exists("/runs/adamw/ids"));
  // A removed unit can be written anew, even with another kind.
  w.dataset("/runs/adamw/step_100", std::vector<double>{1});
  w.commit();
  {
    H5Reader r(path);
    CHECK(r.children("/runs/adamw") == std::vector<std::string>{"ids", "names", "step_100"});
    CHECK(r.is_dataset("/runs/adamw/step_100"));
    CHECK(r.attribute_double("/runs/adamw", "lr") == 1e-3);
    CHECK(r.table("/results").num_rows() == 3);
  }
  w.remove("/");
  CHECK(w.exists("/"));
  CHECK_FALSE(w.exists("/runs"));
  w.commit();
  H5Reader r(path);
  CHECK(r.children("/").empty());
  CHECK(r.attribute_names("/").empty());
}

TEST_CASE("H5Writer::load errors name the file and the object", "[h5]") {
  TempDir dir;
  const std::string missing = dir.file("missing.h5");
  CURV_CHECK_THROWS(H5Writer::load(missing), curv::FormatError, Catch::Contains(missing));
  const std::string text = dir.file("text.h5");
  std::ofstream(text) << "this is not an HDF5 file\n";
  CURV_CHECK_THROWS(H5Writer::load(text), curv::FormatError,
                    Catch::Contains(text) && Catch::Contains("not an HDF5"));
  CHECK_THROWS_AS(H5Writer::load(dir.path()), curv::FormatError);

  curv_test::run_python("check_h5.py", {"unsupported", dir.path()});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"compound.h5", "/ok/pairs"},
      {"bool_attr.h5", "/g/h attribute 'flag'"},
      {"soft_link.h5", "/alias"},
      {"null_attr.h5", "/d attribute 'nothing'"},
      {"attr_2d.h5", "/m attribute 'grid'"}};
  for (const auto& [file, object] : cases) {
    const std::string bad = dir.file(file);
    const std::string before = slurp(bad);
    CURV_CHECK_THROWS(H5Writer::load(bad), curv::FormatError,
                      Catch::Contains(bad) && Catch::Contains(object));
    CHECK(slurp(bad) == before);
  }
  CHECK_THROWS_WITH(H5Writer::load(dir.file("compound.h5")), Catch::Contains("compound"));
}

TEST_CASE("H5Writer lists its tables by path, nested ones and loaded ones too", "[h5]") {
  TempDir dir;
  const std::string path = dir.file("tables.h5");
  Table outer;
  outer.add_column("bucket", std::vector<std::string>{"head", "tail"});
  outer.add_column("nds", std::vector<double>{0.5, kNaN});
  Table inner;
  inner.add_column("batch", std::vector<int64_t>{0, 1, 2});
  H5Writer w(path);
  w.table("/runs/a/step_1/delta/token_buckets", outer);
  w.table("/runs/a/step_1/delta/token_buckets/batches_head", inner);  // a table inside a table
  w.table("/no_columns", Table{});
  w.dataset("/runs/a/loose", std::vector<double>{1, 2});  // a dataset, not a table
  w.attribute("/runs/a", "columns", "not a list");        // a "columns" that is not a table's
  const auto check = [&](const std::map<std::string, Table>& tables) {
    REQUIRE(tables.size() == 3);
    const Table& a = tables.at("/runs/a/step_1/delta/token_buckets");
    CHECK(a.names() == std::vector<std::string>{"bucket", "nds"});
    CHECK(a.strings("bucket") == outer.strings("bucket"));
    CHECK(std::isnan(a.doubles("nds")[1]));
    CHECK(tables.at("/runs/a/step_1/delta/token_buckets/batches_head").int64s("batch") ==
          inner.int64s("batch"));
    CHECK(tables.at("/no_columns").num_columns() == 0);
  };
  check(w.tables());
  w.commit();
  check(H5Writer::load(path).tables());
}
