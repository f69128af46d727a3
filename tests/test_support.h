// Helpers shared by the test files: temporary directories, running Debian's system python3 on
// the fixture scripts in tests/python, and per-dtype tolerances.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <vector>

// LibTorch's logging header includes glog, whose CHECK (abort on failure) replaces Catch's when
// it is included after catch.hpp. Test files include this header last, so CHECK is Catch's.
#undef CHECK
#define CHECK(...) \
  INTERNAL_CATCH_TEST("CHECK", Catch::ResultDisposition::ContinueOnFailure, __VA_ARGS__)

// Checks that `expr` throws `Type` and that its what() satisfies `matcher` (a Catch string
// matcher such as Catch::Matchers::Contains). Evaluates `expr` twice.
#define CURV_CHECK_THROWS(expr, Type, matcher) \
  do {                                         \
    CHECK_THROWS_AS(expr, Type);               \
    CHECK_THROWS_WITH(expr, matcher);          \
  } while (false)

namespace curv_test {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs `python3 tests/python/<script> args...`; fails the test (with its output) on non-zero exit.
void run_python(const std::string& script, const std::vector<std::string>& args);

// The same with the Python that has the pinned transformers and torch 2.x
// (scripts/setup-pypi.sh; CMake's CURV_TRANSFORMERS_PYTHON).
void run_transformers_python(const std::string& script, const std::vector<std::string>& args);

// The output folder of `torchrun --standalone --nproc_per_node 2 tests/python/<script> OUT` run
// by the pinned torch (CURV_TRANSFORMERS_PYTHON), `env` (VAR=value ...) before it: made once per
// build, since multi-rank writers take most of a minute and the tests only read what they write.
// It is kept in the build's test cache under a name that hashes the script and the fixture
// scripts it imports, so a changed script makes it again; a lock makes test processes that start
// together wait for the first one's run. Fails the test with the output when the script fails.
std::string torchrun_fixture(const std::string& script, const std::string& env = "");
// The same for `python tests/python/<script> OUT`, with the pinned torch 2.x (`transformers`:
// CURV_TRANSFORMERS_PYTHON) or the system one (CURV_TEST_PYTHON): made once per build for the
// fixtures several test cases read; `imports` (paths relative to tests/python) are hashed with
// the script, `marker` is the file the script writes last.
std::string python_fixture(const std::string& script, const std::vector<std::string>& imports,
                           const std::string& marker, bool transformers);

// Runs a shell command, returns its exit status; stdout+stderr are captured into `output`.
int run_command(const std::string& command, std::string* output = nullptr);

// Path of a built tool, e.g. tool_path("ndsprobe").
std::string tool_path(const std::string& name);

// Runs a built tool with `args` and --quiet; returns its output. With `status`, the exit status
// goes there; without, a non-zero exit fails the test (with the output).
std::string run_tool(const std::string& name, const std::string& args, int* status = nullptr);

constexpr double kTolFloat64 = 1e-10;
constexpr double kTolFloat32 = 1e-4;

}  // namespace curv_test
