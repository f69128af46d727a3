#include "test_support.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

namespace curv_test {

TempDir::TempDir() {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = base / ("curv_test_" + std::to_string(rd()));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate.string();
      return;
    }
  }
  FAIL("could not create a temporary directory under " << base);
}

TempDir::~TempDir() {
  // POSIX nftw rather than std::filesystem::remove_all: LibTorch 2.x's libtorch_cpu.so exports
  // its own copy of libstdc++'s filesystem functions, and remove_all, interposed across the two
  // libstdc++ builds, crashed (seen with the torch 2.11 wheel and g++ 13).
  ::nftw(
      path_.c_str(),
      [](const char* file, const struct stat*, int, struct FTW*) { return ::remove(file); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

int run_command(const std::string& command, std::string* output) {
  std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return -1;
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) text.append(buffer, n);
  int status = pclose(pipe);
  if (output) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

namespace {

void run_script(const std::string& python, const std::string& script,
                const std::vector<std::string>& args) {
  std::string command = python + " " + CURV_TEST_PYDIR + "/" + script;
  for (const auto& arg : args) command += " '" + arg + "'";
  std::string output;
  int status = run_command(command, &output);
  INFO("command: " << command << "\noutput:\n" << output);
  REQUIRE(status == 0);
}

}  // namespace

void run_python(const std::string& script, const std::vector<std::string>& args) {
  run_script(CURV_TEST_PYTHON, script, args);
}

void run_transformers_python(const std::string& script, const std::vector<std::string>& args) {
  INFO("the Python with transformers comes from scripts/setup-pypi.sh (" CURV_TRANSFORMERS_PYTHON
       ")");
  run_script(CURV_TRANSFORMERS_PYTHON, script, args);
}

namespace {

// The folder `command OUT` makes, made once per build and kept in the build's test cache under a
// name hashing `key` (the scripts' text and the interpreter), `marker` the file that says it is
// complete; a lock makes test processes that start together wait for the first one's run.
std::string cached_output(const std::string& stem, const std::string& key,
                          const std::string& marker, const std::string& command_prefix,
                          const std::string& python) {
  const std::string cache = CURV_TEST_CACHE_DIR;
  std::filesystem::create_directories(cache);
  const std::string done = cache + "/" + stem + "-" + std::to_string(std::hash<std::string>{}(key));
  const int lock =
      ::open((cache + "/" + stem + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  REQUIRE(lock >= 0);
  ::flock(lock, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{lock};
  if (!std::filesystem::exists(done + "/" + marker)) {
    const std::string making = done + ".making";
    std::filesystem::remove_all(making);
    std::filesystem::create_directories(making);
    const std::string command = command_prefix + " " + making;
    std::string output;
    const int status = run_command(command, &output);
    INFO("the Python is " << python << "\n" << command << "\n" << output);
    REQUIRE(status == 0);
    std::filesystem::remove_all(done);
    std::filesystem::rename(making, done);
  }
  return done;
}

std::string text_of(const std::vector<std::string>& scripts) {
  std::string text;
  for (const std::string& name : scripts) {
    std::ifstream in(std::string(CURV_TEST_PYDIR) + "/" + name, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

}  // namespace

std::string torchrun_fixture(const std::string& script, const std::string& env) {
  const std::string text =
      text_of({script, "make_dcp_runs.py", "transformers_reference.py"}) + CURV_TRANSFORMERS_PYTHON;
  return cached_output(script.substr(0, script.find('.')), text, "reference.json",
                       env + " OMP_NUM_THREADS=1 " + CURV_TRANSFORMERS_PYTHON +
                           " -m torch.distributed.run --standalone --nproc_per_node 2 " +
                           CURV_TEST_PYDIR + "/" + script,
                       CURV_TRANSFORMERS_PYTHON);
}

std::string python_fixture(const std::string& script, const std::vector<std::string>& imports,
                           const std::string& marker, bool transformers) {
  const std::string python = transformers ? CURV_TRANSFORMERS_PYTHON : CURV_TEST_PYTHON;
  std::vector<std::string> scripts = {script};
  scripts.insert(scripts.end(), imports.begin(), imports.end());
  const std::string stem =
      script.substr(0, script.find('.')) + (transformers ? "-transformers" : "-system");
  return cached_output(stem, text_of(scripts) + python, marker,
                       "OMP_NUM_THREADS=1 " + python + " " + CURV_TEST_PYDIR + "/" + script,
                       python);
}

std::string tool_path(const std::string& name) {
  return std::string(CURV_TOOLS_DIR) + "/" + name + "/" + name;
}

std::string run_tool(const std::string& name, const std::string& args, int* status) {
  std::string output;
  const int rc = run_command(tool_path(name) + " " + args + " --quiet", &output);
  if (status) {
    *status = rc;
  } else {
    INFO(output);
    REQUIRE(rc == 0);
  }
  return output;
}

}  // namespace curv_test
