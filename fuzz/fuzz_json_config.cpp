// The JSON configs: a model config (ModelConfig::from_json: built-in "arch" configs and
// Hugging Face config.json by model_type) and a native checkpoint's meta.json
// (parse_checkpoint_meta, then its typed views).
#include <string>

#include "curv/core/error.h"
#include "curv/io/checkpoint.h"
#include "curv/models/models.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  curv::fuzz::run_expecting_clean_errors([&] {
    const auto config = curv::ModelConfig::from_json(text, "config.json");
    (void)config.describe();
    (void)curv::ModelConfig::from_json(config.to_json(), "round trip");
  });
  return curv::fuzz::run_expecting_clean_errors([&] {
    const curv::CheckpointMeta meta = curv::parse_checkpoint_meta(text, "meta.json");
    (void)curv::parse_checkpoint_meta(curv::checkpoint_meta_json(meta), "round trip");
  });
}
