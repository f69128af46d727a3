// nanoGPT's layout: ckpt.pt and ckpt_<X>.pt written by train.py, each a torch.save'd dict
// {'model', 'optimizer', 'model_args', 'iter_num', 'best_val_loss', 'config'}.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "curv/core/error.h"
#include "io/builtin_layouts.h"
#include "io/torch_checkpoint.h"

namespace curv {

namespace torch_state {

nlohmann::json nanogpt_model_config(const PyValue& args, const std::string& file) {
  // nanoGPT's GPTConfig; the head is always tied to wte there. Dropout is not carried over:
  // curvature is measured in eval mode, where it does nothing.
  const std::string origin = file + " ['model_args']";
  nlohmann::json model = {{"arch", "gpt"}, {"tied", true}};
  for (const char* key : {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"}) {
    const PyValue* v = args.find(key);
    if (!v || !v->is(PyValue::Kind::kInt)) {
      throw FormatError(fmt::format("{}: '{}' is {}, expected an integer", origin, key,
                                    v ? v->brief() : "missing"));
    }
    model[key] = v->integer;
  }
  if (const PyValue* bias = args.find("bias")) {
    if (!bias->is(PyValue::Kind::kBool)) {
      throw FormatError(
          fmt::format("{}: 'bias' is {}, expected True or False", origin, bias->brief()));
    }
    model["bias"] = bias->boolean;
  }
  return model;
}

}  // namespace torch_state

namespace {

using torch_state::has_suffix;

class NanoGptLayout : public CheckpointLayoutReader {
 public:
  std::string name() const override { return CheckpointLayout::kNanoGPT.name(); }
  std::string brief() const override { return "ckpt.pt or ckpt_*.pt"; }
  std::string expected() const override { return "ckpt.pt or ckpt_*.pt files"; }
  bool holds(const std::string& path, const std::string& entry) const override {
    return has_suffix(entry, ".pt") && (entry == "ckpt.pt" || entry.rfind("ckpt_", 0) == 0) &&
           std::filesystem::is_regular_file(path);
  }
  int64_t step(const std::string& path, const std::string& entry) const override {
    // ckpt_<N>.pt carries its step in the name.
    if (entry.rfind("ckpt_", 0) == 0) {
      if (auto step = step_number(entry.substr(5, entry.size() - 8))) return *step;
    }
    // ckpt.pt, ckpt_best.pt: the step is the file's iter_num (read without the tensors).
    const auto root = load_torch_file(path, TorchFileOptions{false});
    const PyValue* iter = root->find("iter_num");
    if (!iter) throw FormatError(fmt::format("{}: no key 'iter_num' (the step)", path));
    return std::llround(torch_state::number(*iter, path, "iter_num"));
  }
  Checkpoint load(const CheckpointInfo& info, CheckpointParts) const override {
    // nanoGPT's ckpt.pt names its step inside; a file named for a step must agree with it.
    return torch_state::load_torch_save(
        info, has_suffix(info.path, "_" + std::to_string(info.step) + ".pt"));
  }
};

}  // namespace

std::shared_ptr<const CheckpointLayoutReader> nanogpt_layout() {
  return std::make_shared<NanoGptLayout>();
}

}  // namespace curv
