// Shared by the PyTorch checkpoint layouts (not public API): state dicts and optimizer states
// read from torch.save's object tree, and the checkpoint files that torch.save writes whole
// (nanoGPT's ckpt.pt, step_<N>.pt, modded-nanogpt's state_step<N>.pt).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "curv/io/checkpoint.h"
#include "curv/io/param_order.h"
#include "curv/io/torch_file.h"
#include "io/torch_optimizer_rules.h"

namespace curv {

// A torch optimizer.state_dict() as saved: state keyed by parameter index, until
// resolve_optimizer_state maps the indices to the model's names.
struct IndexedOptimizerState {
  struct Group {
    std::vector<int64_t> params;  // indices, in the group's order
    nlohmann::json hyper;         // libcurv's field names
    // The parameter names, when the optimizer recorded them (param_names, PyTorch >= 2.6).
    std::vector<std::string> names;
    // Keller Jordan's MuonWithAuxAdam marks each group: orthogonalised (true) or AdamW (false).
    std::optional<bool> use_muon;
  };
  // The rule by which the program that wrote the state built its groups, which "auto" tries
  // before any guess: `required` when no other rule can name the state (modded-nanogpt's merged
  // optimizers), else preferred where it fits (the Hugging Face Trainer's groups).
  struct WriterRule {
    ParamOrder order = ParamOrder::kAuto;
    bool required = false;
    std::string writer;  // "train_gpt_simple.py", for messages
  };
  std::vector<Group> groups;
  std::map<int64_t, NamedTensors> state;  // index -> (key, tensor), non-scalar states only
  // Where the state tensors left unread are (a DCP save's shards): `source` holds them, and
  // stored_as names each, (index, key) → its name there. Their tensors in `state` are placeholders
  // of their shape and dtype on the meta device; resolve_optimizer_state makes `source` the
  // checkpoint's optimizer_source under the parameters' names.
  SharedTensorSource source;
  std::map<std::pair<int64_t, std::string>, std::string> stored_as;
  std::string origin;  // "<file> ['optimizer']" for messages
  std::optional<WriterRule> writer_rule;
  // modded-nanogpt's two optimizers (AdamW, then Muon) merged into one state: AdamW's groups
  // first (use_muon false), then Muon's with its indices after AdamW's (the "modded" rule).
  bool modded = false;
  int64_t muon_offset = 0;  // Muon's index k is k + muon_offset here
  // What recognition reads (name_optimizer recognises again with the user's rule).
  torch_state::OptimizerKeys keys;
  // The partition the user named (name_optimizer's muon_params): resolve_optimizer_state records
  // it in place of the one the use_muon groups give.
  std::optional<std::string> muon_params;
  // Why the state cannot be used (e.g. Muon state sharded across ranks): resolve_optimizer_state
  // throws it, so that the model still loads for directions that need no optimizer state.
  std::string problem;
};

namespace torch_state {

constexpr const char* kCompilePrefix = "_orig_mod.";

bool has_suffix(const std::string& s, const std::string& suffix);
// `*v` when it is of `kind`; FormatError naming `origin` and `key` otherwise (or when absent).
const PyValue& require(const PyValue* v, const std::string& origin, const std::string& key,
                       PyValue::Kind kind);
// An int, float, bool or one-element tensor as a double; FormatError naming `origin` and `key`.
double number(const PyValue& v, const std::string& origin, const std::string& key);
// Buffers that state dicts carry beside the parameters and that are dropped on reading.
bool is_saved_buffer(const std::string& name, size_t ndim);
// A model state dict: string keys to tensors, torch.compile's prefix removed, saved buffers
// dropped. FormatError naming `origin` and the key.
NamedTensors state_dict(const PyValue& dict, const std::string& origin);
// Whether `dict` is a non-empty dict of string keys to tensors (a bare state dict).
bool all_tensors(const PyValue& dict);
// optimizer.state_dict(): {'state': {index: {key: tensor | number}}, 'param_groups': [...]}.
// Also fills meta["optimizer"] with the rule recognised from the keys (torch does not save the
// optimizer's class: recognise_optimizer) or the refusal, group 0's hyper-parameters and the
// step count. `implied_rule` and `implied_by`: the rule the file's writer always uses, where its
// layout says (OptimizerKeys).
std::shared_ptr<IndexedOptimizerState> optimizer_state_dict(const PyValue& dict,
                                                            const std::string& origin,
                                                            nlohmann::json& meta,
                                                            const std::string& implied_rule = "",
                                                            const std::string& implied_by = "");

// An AdamW group's hyper-parameters as the AdamW part of a Muon rule reads them: lr, beta1, beta2,
// eps and weight_decay as adam_*, decoupled as it is (AdaMuon's weight_decouple); the rest left
// out.
nlohmann::json adam_part_hyper(const nlohmann::json& hyper);
// Several optimizers' states saved as a list ('optimizer': [muon.state_dict(),
// adamw.state_dict()]): torch.optim.Muon over the matrices with torch.optim.AdamW over the rest,
// in either order, read as one state of the rule torch-muon (Muon's groups first, orthogonalised;
// AdamW's as its adam_* part), each part recognised by its keys. Fills meta["optimizer"] as
// optimizer_state_dict does; a list of any other rules is recorded as a refusal naming them.
// FormatError naming `origin` when an item is not a state dict.
std::shared_ptr<IndexedOptimizerState> optimizer_list(const PyValue& list,
                                                      const std::string& origin,
                                                      nlohmann::json& meta);

// A torch.save'd checkpoint file's content in the native form, before its step is checked.
struct SavedCheckpoint {
  NamedTensors model;
  std::shared_ptr<IndexedOptimizerState> optimizer;
  nlohmann::json meta = nlohmann::json::object();
  std::string model_origin;         // the file, and the key when the state dict is nested
  std::string model_config_origin;  // where meta["model"] came from, "" without one
};
// nanoGPT's 'model_args' (GPTConfig) as the built-in GPT's config; FormatError naming the file.
nlohmann::json nanogpt_model_config(const PyValue& args, const std::string& file);
// modded-nanogpt's dict(step, code, model, optimizers) (train_gpt_simple.py): whether `root`
// is one, and its model config and merged optimizer state into `out`.
// Marks the groups `r` orthogonalises (use_muon) and returns the state's hyper-parameters for
// meta's optimizer.hyper: group 0's, or for Muon the first group of each kind.
nlohmann::json adopt_recognition(IndexedOptimizerState& state, const Recognition& r);
bool is_modded_save(const PyValue& root, const NamedTensors& model);
void read_modded_save(const PyValue& root, const std::string& file, SavedCheckpoint& out);
// A checkpoint file written whole by torch.save (nanoGPT's, step_<N>.pt). `named_by_step`: the
// file's name gives its step, and a different iter_num inside is kept only as a record;
// otherwise they must agree.
Checkpoint load_torch_save(const CheckpointInfo& info, bool named_by_step);

}  // namespace torch_state
}  // namespace curv
