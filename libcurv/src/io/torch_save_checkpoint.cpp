// Checkpoint files that torch.save writes whole (nanoGPT's ckpt.pt, step_<N>.pt, modded-nanogpt's
// state_step<N>.pt): the saved object interpreted as model, optimizer and records.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "core/strings.h"
#include "curv/core/error.h"
#include "io/torch_checkpoint.h"

namespace curv::torch_state {

namespace {

using Kind = PyValue::Kind;

// A torch.save'd checkpoint object: a bare state dict, or a dict holding one under 'model' (or
// 'model_state_dict', 'state_dict') and optionally an optimizer state dict under 'optimizer' (or
// 'optimizer_state_dict'), nanoGPT's 'model_args' and 'iter_num'.
SavedCheckpoint interpret(const PyValue& root, const std::string& file) {
  SavedCheckpoint out;
  if (!root.is(Kind::kDict)) {
    throw FormatError(fmt::format("{}: holds a {}, expected a state dict or a dict with 'model'",
                                  file, root.type_name()));
  }
  if (all_tensors(root)) {
    out.model = state_dict(root, file);
    out.model_origin = file;
    return out;
  }
  std::string model_key;
  for (const char* key : {"model", "model_state_dict", "state_dict"}) {
    if (root.find(key)) {
      model_key = key;
      break;
    }
  }
  if (model_key.empty()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : root.entries) keys.push_back(k->brief());
    throw FormatError(
        fmt::format("{}: no model state dict: expected tensors or a key 'model', "
                    "'model_state_dict' or 'state_dict'; keys: {}",
                    file, join(keys, ", ")));
  }
  const std::string model_origin = fmt::format("{} ['{}']", file, model_key);
  out.model_origin = model_origin;
  out.model = state_dict(require(root.find(model_key), file, model_key, Kind::kDict), model_origin);
  // nanoGPT's train.py (its 'model_args') builds torch.optim.AdamW: that settles Adam against
  // AdamW where the groups do not record decoupled_weight_decay (torch < 2.7).
  const PyValue* args = root.find("model_args");
  // Several optimizers (torch.optim.Muon with AdamW) saved as a list under 'optimizer' or
  // 'optimizers'; modded-nanogpt's 'optimizers' are read with its script below.
  const bool modded = is_modded_save(root, out.model);
  for (const char* key : {"optimizer", "optimizer_state_dict", "optimizers"}) {
    const PyValue* opt = root.find(key);
    if (opt && (opt->is(Kind::kList) || opt->is(Kind::kTuple)) && !modded) {
      out.optimizer = optimizer_list(*opt, fmt::format("{} ['{}']", file, key), out.meta);
      break;
    }
    if (opt && !opt->is(Kind::kNone) && std::string(key) != "optimizers") {
      const std::string origin = fmt::format("{} ['{}']", file, key);
      out.optimizer = optimizer_state_dict(
          require(opt, file, key, Kind::kDict), origin, out.meta, args ? "adamw" : "",
          args ? "nanoGPT's train.py builds torch.optim.AdamW" : "");
      break;
    }
  }
  if (args) {
    out.meta["model"] = nanogpt_model_config(require(args, file, "model_args", Kind::kDict), file);
    out.model_config_origin = file + " ['model_args']";
  }
  if (modded) read_modded_save(root, file, out);
  if (const PyValue* step = root.find("step"); step && step->is(Kind::kInt)) {
    out.meta["step"] = step->integer;
  }
  if (const PyValue* iter = root.find("iter_num")) {
    out.meta["step"] = static_cast<int64_t>(std::llround(number(*iter, file, "iter_num")));
  }
  return out;
}

}  // namespace

Checkpoint load_torch_save(const CheckpointInfo& info, bool named_by_step) {
  Checkpoint ckpt;
  ckpt.step = info.step;
  ckpt.path = info.path;
  const auto root = load_torch_file(info.path);
  SavedCheckpoint parts = interpret(*root, info.path);
  ckpt.model_file = parts.model_origin;
  ckpt.optimizer_file = parts.optimizer ? parts.optimizer->origin : info.path;
  ckpt.meta_file = info.path;
  ckpt.model_config_file = parts.model_config_origin;
  // nanoGPT's ckpt.pt names its step inside; a file named for a step must agree with it.
  if (parts.meta.contains("step")) {
    const int64_t step = parts.meta["step"].get<int64_t>();
    if (step != info.step) {
      if (named_by_step) {
        // Files named by step (step_<N>.pt, ckpt_<N>.pt) take the name's step; a different
        // iter_num inside is kept only as a record.
        parts.meta["iter_num"] = step;
      } else {
        throw FormatError(
            fmt::format("{}: iter_num is {} but the checkpoint was listed as step "
                        "{}",
                        info.path, step, info.step));
      }
    }
  }
  parts.meta["step"] = info.step;
  ckpt.model = std::move(parts.model);
  ckpt.indexed_optimizer = parts.optimizer;
  ckpt.meta = parse_checkpoint_meta(parts.meta.dump(), ckpt.meta_file);
  return ckpt;
}

}  // namespace curv::torch_state
