// scripts/reproduce.sh end to end at toy size: the sweep's choice, the seeds, ndsprobe with the
// paired comparisons, and the summary's statistics recomputed independently from the HDF5 files
// (tests/python/check_reproduce.py); a second invocation resumes and trains nothing again. And
// scripts/optimizers.sh, the same steps on six optimizers, each audited along the step its own rule
// rebuilds (tests/python/check_optimizers_study.py).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

using namespace curv_test;
namespace fs = std::filesystem;

namespace {

// DIR/tiny.json: a 2-layer LLaMA of width 16, so that every unit takes milliseconds.
void write_tiny_llama(const TempDir& dir) {
  std::ofstream(dir.file("tiny.json")) << R"({"arch": "llama", "vocab_size": 64,
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 16,
    "tie_word_embeddings": true})";
}

}  // namespace

TEST_CASE("reproduce.sh sweeps chooses seeds probes and summarizes with checked statistics",
          "[reproduce]") {
  TempDir dir;
  write_tiny_llama(dir);
  const std::string build = fs::path(CURV_TOOLS_DIR).parent_path().string();
  const std::string out = dir.file("study");
  const std::string command =
      "CURV_SKIP_BUILD=1 CURV_BUILD_DIR=" + build + " CURV_REPRO_DIR=" + out +
      " CURV_REPRO_STEPS=12 CURV_REPRO_CHECKPOINTS=3 CURV_REPRO_SEEDS='0 1'"
      " CURV_REPRO_EXPONENTS='0 1' CURV_REPRO_JOBS=2 CURV_REPRO_MODEL=" +
      dir.file("tiny.json") + " " + CURV_SOURCE_DIR + "/scripts/reproduce.sh";
  std::string output;
  int status = run_command(command, &output);
  INFO(output);
  REQUIRE(status == 0);
  REQUIRE(fs::exists(out + "/summary.md"));
  for (const char* plot : {"nds_ratio", "rho_within", "head_tail_nds", "validation_loss"}) {
    CHECK(fs::exists(out + "/plots/" + plot + ".png"));
  }
  run_python("check_reproduce.py", {out});

  // Resumed: nothing is trained again, and the study's numbers stay as they were.
  std::map<std::string, fs::file_time_type> trained;
  for (const auto& entry : fs::recursive_directory_iterator(out + "/runs")) {
    if (entry.path().filename() == "log.csv") trained[entry.path()] = entry.last_write_time();
  }
  REQUIRE(trained.size() >= 2 * 3 * 4);  // s, optimizers, seeds 0 and 1 and two more rates
  status = run_command(command, &output);
  REQUIRE(status == 0);
  CHECK(output.find("trained") == std::string::npos);
  for (const auto& [path, time] : trained) {
    INFO(path);
    CHECK(fs::last_write_time(path) == time);
  }
  run_python("check_reproduce.py", {out});
}

TEST_CASE("optimizers.sh trains probes and summarizes every optimizer along its own update",
          "[reproduce]") {
  TempDir dir;
  write_tiny_llama(dir);
  const std::string build = fs::path(CURV_TOOLS_DIR).parent_path().string();
  const std::string out = dir.file("optimizers");
  const std::string optimizers = "adamw muon soap shampoo adafactor adamw-schedulefree";
  const std::string command =
      "CURV_SKIP_BUILD=1 CURV_BUILD_DIR=" + build + " CURV_OPTIMIZERS_DIR=" + out +
      " CURV_OPTIMIZERS_STEPS=6 CURV_REPRO_CHECKPOINTS=2 CURV_OPTIMIZERS_SEEDS='0 1'"
      " CURV_OPTIMIZERS_EXPONENTS=1 CURV_REPRO_JOBS=2 CURV_REPRO_MODEL=" +
      dir.file("tiny.json") + " " + CURV_SOURCE_DIR + "/scripts/optimizers.sh";
  std::string output;
  const int status = run_command(command, &output);
  INFO(output);
  REQUIRE(status == 0);
  for (const char* plot : {"nds", "rho_within", "validation_loss"}) {
    CHECK(fs::exists(out + "/plots/" + plot + ".png"));
  }
  std::vector<std::string> args = {out};
  std::istringstream names(optimizers);
  for (std::string name; names >> name;) args.push_back(name);
  run_python("check_optimizers_study.py", args);
}
