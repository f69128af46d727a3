// A Hugging Face checkpoint-<N>/ folder: the input is split at "\n--\n" into config.json,
// model.safetensors.index.json and trainer_state.json; the folder also holds one valid shard,
// model-00001-of-00001.safetensors, that an index may name. Covers listing, the sharded index,
// the trainer state's global_step and the config.json read as a model config.
#include "curv/io/checkpoint.h"
#include "curv/models/models.h"
#include "fuzz_support.h"

namespace {

const uint8_t kShard[] = {
#include "tiny_model_safetensors.inc"
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return curv::fuzz::run_expecting_clean_errors([&] {
    const auto parts = curv::fuzz::split(data, size, "\n--\n", 3);
    const std::string run = curv::fuzz::scratch_dir() + "/run";
    curv::fuzz::write_file("run/checkpoint-7/config.json", parts[0]);
    curv::fuzz::write_file("run/checkpoint-7/model.safetensors.index.json", parts[1]);
    if (!parts[2].empty()) curv::fuzz::write_file("run/checkpoint-7/trainer_state.json", parts[2]);
    curv::fuzz::write_file("run/checkpoint-7/model-00001-of-00001.safetensors", kShard,
                           sizeof(kShard));
    for (const auto& info : curv::list_checkpoints(run)) {
      const curv::Checkpoint ckpt = curv::load_checkpoint(info);
      (void)ckpt.meta_json();
      const std::string config = ckpt.model_config_json();
      if (!config.empty()) (void)curv::ModelConfig::from_json(config, ckpt.model_config_file);
    }
  });
}
