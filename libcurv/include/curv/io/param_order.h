// The rules that name a torch optimizer's parameter indices after the model's parameters
// (--param-order, resolve_optimizer_state in curv/io/checkpoint.h), and their names.
#pragma once

#include <string>
#include <vector>

namespace curv {

// PyTorch numbers parameters by their position in param_groups; each rule says how the groups
// were built from the model (docs/checkpoints.md#optimizer-parameter-order).
enum class ParamOrder {
  kAuto,     // the recorded names, else the layout's own rule, else whichever of model, ndim and
             // hidden fits
  kModel,    // all groups together in model order
  kNdim,     // two groups: ndim >= 2, then the rest (nanoGPT)
  kHidden,   // Muon's hidden matrices filling whole groups, then the rest
  kModded,   // modded-nanogpt's AdamW groups, then Muon's size-sorted block matrices
  kTrainer,  // the Hugging Face Trainer's groups: weight-decayed parameters, then the rest
  kFile,     // file:PATH, one name per line in index order
  kNames,    // the names the optimizer recorded (param_names); chosen by auto, never named
};

// A rule as a user writes it: the rule and, for kFile, the path.
struct ParamOrderSpec {
  ParamOrder order = ParamOrder::kAuto;
  std::string path;  // kFile only

  // As --param-order takes it and meta.json's optimizer.param_order records it: "ndim",
  // "file:PATH", "names".
  std::string text() const;
};

// "auto", "model", "ndim", "hidden", "modded", "trainer", "file:" (the prefix of file:PATH) or
// "names".
std::string param_order_name(ParamOrder order);
// "auto", "model", ..., "trainer" or "file:PATH"; InvalidOption naming the text (as the option
// ParamOrderSpec) and listing the choices otherwise ("names" is not one: auto chooses it).
ParamOrderSpec parse_param_order(const std::string& text);
// The rules a user may name, in the order messages list them ("file:PATH" for kFile).
std::vector<std::string> param_order_choices();

}  // namespace curv
