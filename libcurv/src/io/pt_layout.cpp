// The step_<N>.pt layout: one torch.save'd file per step, a bare state dict or a dict with
// 'model' (or 'model_state_dict', 'state_dict') and optional 'optimizer'; modded-nanogpt's
// state_step<N>.pt files are listed here too (N zero-padded).
#include <filesystem>

#include "io/builtin_layouts.h"
#include "io/torch_checkpoint.h"

namespace curv {

namespace {

std::optional<int64_t> pt_step(const std::string& entry) {
  if (!torch_state::has_suffix(entry, ".pt")) return std::nullopt;
  for (const std::string prefix : {"step_", "state_step"}) {
    if (entry.rfind(prefix, 0) == 0) {
      return step_number(entry.substr(prefix.size(), entry.size() - prefix.size() - 3));
    }
  }
  return std::nullopt;
}

class TorchStepsLayout : public CheckpointLayoutReader {
 public:
  std::string name() const override { return CheckpointLayout::kTorchSteps.name(); }
  std::string brief() const override { return "step_<N>.pt files"; }
  bool holds(const std::string& path, const std::string& entry) const override {
    return pt_step(entry) && std::filesystem::is_regular_file(path);
  }
  int64_t step(const std::string&, const std::string& entry) const override {
    return *pt_step(entry);
  }
  Checkpoint load(const CheckpointInfo& info, CheckpointParts) const override {
    return torch_state::load_torch_save(info, /*named_by_step=*/true);
  }
};

}  // namespace

std::shared_ptr<const CheckpointLayoutReader> torch_steps_layout() {
  return std::make_shared<TorchStepsLayout>();
}

}  // namespace curv
