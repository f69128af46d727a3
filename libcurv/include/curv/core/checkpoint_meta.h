// What a checkpoint records beside its parameters, typed: the step, the optimizer that saved it
// (name, hyper-parameters, step count, partition, parameter groups) and its state tensors. io fills
// these from meta.json and the optimizer files; optim and analysis read them without any file.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "curv/core/param_space.h"
#include "curv/core/tensor_source.h"

namespace curv {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One torch parameter group, named after the model's parameters (meta.json's
// "optimizer.param_groups[]": {"params": [names], "hyper": {key: number}}).
struct OptimizerParamGroup {
  std::vector<std::string> params;
  std::vector<std::pair<std::string, double>> hyper;  // libcurv's field names
};

// meta.json's "optimizer" object.
struct OptimizerRecord {
  std::string name;  // "adamw", "muon", ...; "" when the checkpoint names none
  // "hyper": the numeric hyper-parameters as stored. Checkpoints libcurv writes record every
  // OptimizerConfig field, read by the optimizer or not; converted torch checkpoints record what
  // their param_groups hold.
  std::vector<std::pair<std::string, double>> hyper;
  // "hyper" entries that are not numbers, (key, value as JSON text): kept, not rejected at load,
  // because only reading one (hyper_or) makes it an error.
  std::vector<std::pair<std::string, std::string>> non_numeric_hyper;
  std::optional<int64_t> step_count;       // "step_count": updates taken
  std::optional<std::string> muon_params;  // "muon_params": the Muon family's partition regex
  // "partition": the rule each parameter got, (param, "muon" | "adamw" | ...), as written.
  std::vector<std::pair<std::string, std::string>> partition;
  // "param_groups": groups with their own hyper-parameters (filled by resolve_optimizer_state
  // for torch checkpoints); empty when the optimizer had one.
  std::vector<OptimizerParamGroup> param_groups;
  std::string param_order;  // "param_order": the rule that named torch's indices, "" if none
  // "recognition": how `name` was chosen for a torch state ("recognised by keys: state exp_avg,
  // ...", "named by the user (adam)"); "" where the checkpoint's writer recorded the name.
  std::string recognition;
  // "refusal": why a saved state has no rule (no rule fits, two fit alike, or one that is not
  // rebuilt), one line naming the file; `name` is then "". Directions rebuilt from saved state
  // fail with it.
  std::string refusal;

  // hyper[key] if present, else `fallback`. FormatError naming `origin`, "optimizer.hyper.<key>"
  // and the stored value when that value is not a number.
  double hyper_or(const std::string& key, double fallback, const std::string& origin) const;
};

// meta.json as a whole: {"step": N, "optimizer": {...}, "model": {...}, ...anything else}.
struct CheckpointMeta {
  std::optional<int64_t> step;               // "step"
  std::optional<OptimizerRecord> optimizer;  // "optimizer", absent when the file has none
  // "model": the model config as JSON text (ModelConfig::from_json reads it); "" if absent.
  std::string model_json;
  // The document as read, so that keys libcurv does not type ("note", nanoGPT's "iter_num", ...)
  // survive a load and save; writers put the typed fields above over it.
  std::string json = "{}";
};

// A checkpoint's optimizer state and record, without the checkpoint: what optimizer directions
// and the Adam preconditioner rebuild steps from.
struct SavedOptimizer {
  std::string checkpoint;  // the checkpoint's folder or file, for messages
  int64_t step = 0;        // the checkpoint's step (the step count when none is recorded)
  // The state as "<param>.<key>" (exp_avg, exp_avg_sq, momentum_buffer, ...), read a tensor at a
  // time when a parameter's step needs it; null when the checkpoint holds none.
  SharedTensorSource state;
  std::string file;        // where `state` comes from: "<folder>/optimizer.safetensors", ...
  std::string meta_file;   // where `record` comes from: "<folder>/meta.json", ...
  OptimizerRecord record;  // empty name when the checkpoint names no optimizer
  // torch state still keyed by parameter index (resolve_optimizer_state has not named it).
  bool unresolved = false;

  int64_t step_count() const { return record.step_count.value_or(step); }
  bool has_state() const { return state && !state->entries().empty(); }
  double hyper(const std::string& key, double fallback) const {
    return record.hyper_or(key, fallback, meta_file);
  }
};

// Optimizer state "<param>.<key>" (e.g. key "exp_avg_sq") as stored, read now onto the CPU, or an
// undefined tensor if absent: whether that is an error depends on the caller.
at::Tensor optimizer_state(const SavedOptimizer& saved, const std::string& param,
                           const std::string& key);
// The same, checked against the parameter: InvalidArgument naming the state's file, the
// parameter, the key and both shapes when the shapes differ. When absent: an undefined tensor,
// or, if `required`, InvalidArgument naming the file (or its absence), parameter and key, and
// the states the file does hold for that parameter.
at::Tensor optimizer_state(const SavedOptimizer& saved, const ParamInfo& param,
                           const std::string& key, bool required = false);

}  // namespace curv
