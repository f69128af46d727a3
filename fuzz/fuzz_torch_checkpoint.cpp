// A .pt checkpoint as ndsprobe reads it: the first byte picks the layout (nanoGPT ckpt.pt,
// step_<N>.pt, or a Hugging Face folder's optimizer.pt), the rest is the file. Covers layout
// detection, listing (iter_num), the interpretation of the unpickled tree (model, optimizer,
// model_args, param_groups) and the model config it implies.
#include "curv/io/checkpoint.h"
#include "curv/models/models.h"
#include "fuzz_support.h"

namespace {

const uint8_t kShard[] = {
#include "tiny_model_safetensors.inc"
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  return curv::fuzz::run_expecting_clean_errors([&] {
    const std::string run = curv::fuzz::scratch_dir() + "/run";
    switch (data[0] % 3) {
      case 0:
        curv::fuzz::write_file("run/ckpt.pt", data + 1, size - 1);
        break;
      case 1:
        curv::fuzz::write_file("run/step_5.pt", data + 1, size - 1);
        break;
      default:
        curv::fuzz::write_file("run/checkpoint-5/model.safetensors", kShard, sizeof(kShard));
        curv::fuzz::write_file("run/checkpoint-5/optimizer.pt", data + 1, size - 1);
        break;
    }
    for (const auto& info : curv::list_checkpoints(run)) {
      const curv::Checkpoint ckpt = curv::load_checkpoint(info);
      (void)ckpt.optimizer_name();
      (void)ckpt.step_count();
      (void)ckpt.meta_json();
      const std::string config = ckpt.model_config_json();
      if (!config.empty()) (void)curv::ModelConfig::from_json(config, ckpt.model_config_file);
    }
  });
}
