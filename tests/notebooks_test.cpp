// Every notebook in notebooks/ runs headless, start to end, on a small demo-shaped output made
// here with curvtrain and ndsprobe; committed notebooks carry no outputs.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace fs = std::filesystem;
using namespace curv_test;

namespace {

std::vector<fs::path> notebooks() {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(fs::path(CURV_SOURCE_DIR) / "notebooks")) {
    if (entry.path().extension() == ".ipynb") out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// DEMO_DIR-shaped folder: runs/<opt>_s0 with log.csv, train_probe.h5 and ndsprobe.h5 carrying
// every result kind the notebooks plot.
void make_demo_dir(const std::string& dir) {
  const std::string model = dir + "/model.json";
  std::ofstream(model) << R"({"arch": "gpt", "vocab_size": 64, "block_size": 8, "n_layer": 2,
                             "n_head": 2, "n_embd": 16})";
  std::vector<std::string> runs;
  for (const std::string optimizer : {"adamw", "muon"}) {
    const std::string run = fmt::format("{}/runs/{}_s0", dir, optimizer);
    run_tool("curvtrain",
             fmt::format("-o {} --model {} --optimizer {} --steps 20 --save-every 10 "
                         "--eval-every 10 --probe-every 10 --probe-output {}/train_probe.h5 "
                         "--probe-sequences 16 --run-name {}_s0",
                         run, model, optimizer, dir, optimizer));
    runs.push_back(run);
  }
  run_tool("ndsprobe",
           fmt::format("{} {} --data {}/probe.safetensors --directions update,delta "
                       "--batch-size 4 --token-buckets head --ggn --compare "
                       "adamw_s0/update:muon_s0/update "
                       "--within --modes 2 --multipliers 0.5,2 --spectrum --eig-top 2 "
                       "--eig-max-hvps 30 --spectrum-blocks --trace hutchpp --trace-hvps 12 "
                       "--density --slq-runs 2 --slq-steps 10 --precond-sharpness --overlap "
                       "-o {}/ndsprobe.h5",
                       runs[0], runs[1], runs[0], dir));
}

}  // namespace

TEST_CASE("committed notebooks carry no outputs", "[notebooks]") {
  const auto books = notebooks();
  REQUIRE(books.size() >= 4);
  for (const auto& path : books) {
    INFO(path.string());
    std::ifstream in(path);
    const auto nb = nlohmann::json::parse(in);
    for (const auto& cell : nb.at("cells")) {
      if (cell.at("cell_type") != "code") continue;
      CHECK(cell.at("outputs").empty());
      CHECK(cell.at("execution_count").is_null());
    }
  }
}

TEST_CASE("every notebook executes headless on a small probe file", "[notebooks][tools]") {
  TempDir dir;
  make_demo_dir(dir.path());
  for (const auto& path : notebooks()) {
    INFO(path.filename().string());
    std::string output;
    // The kernel runs in the notebook's folder, so the notebooks' relative path to
    // tools/python holds; CURV_DEMO_DIR points them at the small output.
    const int rc = run_command(
        fmt::format("cd {} && CURV_DEMO_DIR={} {} -m nbconvert --to notebook --execute "
                    "--ExecutePreprocessor.timeout=600 --ExecutePreprocessor.kernel_name=python3 "
                    "--output-dir {} {} 2>&1",
                    path.parent_path().string(), dir.path(), CURV_TEST_PYTHON, dir.path(),
                    path.filename().string()),
        &output);
    INFO(output);
    CHECK(rc == 0);
    CHECK(fs::exists(fs::path(dir.path()) / path.filename()));
  }
}
