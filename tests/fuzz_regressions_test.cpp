// Inputs that crashed a fuzz harness (fuzz/, docs/reliability.md#fuzzing), replayed through the
// same API: each must now be rejected with a curv::Error. tests/fuzz_regressions/<kind>/<file>,
// <kind> naming the reader as the harness fuzz/fuzz_<kind>.cpp does.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "curv/analysis/report.h"
#include "curv/core/error.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "curv/io/token_data.h"
#include "curv/io/torch_file.h"
#include "curv/models/models.h"
#include "test_support.h"

namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

// Replays one crash input as its harness would, into `dir`.
void replay(const std::string& kind, const std::string& bytes, const fs::path& dir) {
  if (kind == "safetensors") {
    write_bytes(dir / "input.safetensors", bytes);
    curv::SafetensorsReader reader((dir / "input.safetensors").string());
    for (const auto& name : reader.names()) (void)reader.tensor(name);
  } else if (kind == "torch_file") {
    write_bytes(dir / "input.pt", bytes);
    (void)curv::load_torch_file((dir / "input.pt").string())->brief();
  } else if (kind == "torch_checkpoint") {
    // First byte: the layout, as in fuzz/fuzz_torch_checkpoint.cpp (0 nanoGPT, 1 step_<N>.pt).
    REQUIRE(!bytes.empty());
    const char* names[] = {"run/ckpt.pt", "run/step_5.pt"};
    write_bytes(dir / names[static_cast<unsigned char>(bytes[0]) % 3 % 2], bytes.substr(1));
    for (const auto& info : curv::list_checkpoints((dir / "run").string())) {
      const auto ckpt = curv::load_checkpoint(info);
      if (!ckpt.model_config_json().empty()) {
        (void)curv::ModelConfig::from_json(ckpt.model_config_json(), ckpt.model_config_file);
      }
    }
  } else if (kind == "model_config") {
    (void)curv::ModelConfig::from_json(bytes, "config.json");
  } else if (kind == "meta_json") {
    (void)curv::parse_checkpoint_meta(bytes, "meta.json");
  } else if (kind == "token_file") {
    write_bytes(dir / "tokens.bin", bytes);
    (void)curv::TokenData::from_uint16_file((dir / "tokens.bin").string());
  } else if (kind == "h5") {
    write_bytes(dir / "input.h5", bytes);
    (void)curv::H5Writer::load((dir / "input.h5").string());
  } else {
    FAIL("unknown regression kind " << kind);
  }
}

}  // namespace

TEST_CASE("fuzz regressions: every crash input is now a clean curv::Error", "[fuzz]") {
  const fs::path root = fs::path(CURV_SOURCE_DIR) / "tests" / "fuzz_regressions";
  std::vector<fs::path> inputs;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.is_regular_file() && entry.path().filename() != "README.md") {
      inputs.push_back(entry.path());
    }
  }
  std::sort(inputs.begin(), inputs.end());
  curv_test::TempDir tmp;
  for (const auto& input : inputs) {
    const std::string kind = input.parent_path().filename().string();
    INFO("replaying " << fs::relative(input, root).string());
    const fs::path dir = fs::path(tmp.path()) / input.filename();
    CHECK_THROWS_AS(replay(kind, read_bytes(input), dir), curv::Error);
  }
  SUCCEED(inputs.size() << " crash inputs replayed");
}
