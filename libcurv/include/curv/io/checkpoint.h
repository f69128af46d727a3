// Checkpoint directories — the native layout DIR/step_<N>/ with model.safetensors, optional
// optimizer.safetensors and meta.json, and PyTorch's layouts (nanoGPT ckpt.pt, Hugging Face
// checkpoint-<N>/, step_<N>.pt): listing, step selection, loading, matching to a model, saving.
// Layouts are a registry (curv/io/checkpoint_layout.h); listing and loading go through it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "curv/core/checkpoint_meta.h"
#include "curv/core/param_space.h"
#include "curv/core/structure.h"
#include "curv/io/param_order.h"
#include "curv/io/tensor_source.h"

namespace curv {

// How a run directory stores its checkpoints (docs/checkpoints.md), by the name --layout takes:
// "auto", a built-in below, or one added with register_checkpoint_layout
// (curv/io/checkpoint_layout.h). A name rather than an enum, so that a layout is one file.
class CheckpointLayout {
 public:
  static const CheckpointLayout kAuto;         // detected from the directory's entries
  static const CheckpointLayout kNative;       // step_<N>/model.safetensors, ...
  static const CheckpointLayout kNanoGPT;      // ckpt.pt or ckpt_<anything>.pt
  static const CheckpointLayout kHuggingFace;  // checkpoint-<N>/ folders of the Trainer
  static const CheckpointLayout kTorchSteps;   // step_<N>.pt: a state dict, or a dict with 'model'

  explicit CheckpointLayout(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  bool operator==(const CheckpointLayout& other) const { return name_ == other.name_; }
  bool operator!=(const CheckpointLayout& other) const { return name_ != other.name_; }

 private:
  std::string name_;
};
inline const CheckpointLayout CheckpointLayout::kAuto{"auto"};
inline const CheckpointLayout CheckpointLayout::kNative{"native"};
inline const CheckpointLayout CheckpointLayout::kNanoGPT{"nanogpt"};
inline const CheckpointLayout CheckpointLayout::kHuggingFace{"hf"};
inline const CheckpointLayout CheckpointLayout::kTorchSteps{"pt"};

// "auto" or a registered layout's name; InvalidArgument naming the text and listing them.
CheckpointLayout parse_checkpoint_layout(const std::string& text);
std::string layout_name(const CheckpointLayout& layout);
// The layout of `dir` from its entries: native when it holds a native checkpoint, else the one
// other layout it holds. FormatError naming `dir` when none fits, or when entries of two layouts
// are present (then --layout chooses).
CheckpointLayout detect_checkpoint_layout(const std::string& dir);

// One checkpoint found by list_checkpoints.
struct CheckpointInfo {
  int64_t step = 0;
  std::string path;  // the step_<N> or checkpoint-<N> folder, or the .pt file
  CheckpointLayout layout = CheckpointLayout::kNative;
};

// What a checkpoint digest reads. kFull: every byte of every file, "crc32:XXXXXXXX bytes:N".
// kRecorded: what the files record about themselves, a few kilobytes per file whatever its size,
// "recorded:XXXXXXXX bytes:N": each file's name and size; a zip archive's central directory
// (torch.save files: every record's CRC-32 and size); a safetensors header; small files
// (.metadata, JSON, up to 1 MiB) whole; and of every larger file 16 blocks of 64 KiB spread over
// it, so that a re-saved tensor, which changes nearly all its bytes, changes the digest.
enum class DigestKind { kRecorded, kFull };
// The checkpoint's content digest, so that a resumed run can tell whether a checkpoint changed
// since its results were written: every regular file it consists of (a folder's files, in its
// subfolders too, by relative path; or the file). FormatError naming the file when one cannot be
// read.
std::string checkpoint_digest(const CheckpointInfo& info, DigestKind kind = DigestKind::kRecorded);
// The kind of a digest checkpoint_digest wrote ("crc32:" is kFull, as every digest written
// before kRecorded existed), so that a resumed run compares like with like.
DigestKind digest_kind_of(const std::string& digest);

// Which checkpoints of a run to analyse: those with first <= step <= last, then every stride-th of
// them by position (the first in range is always kept), so a run saved at irregular steps thins
// evenly.
struct StepSelection {
  int64_t first = std::numeric_limits<int64_t>::min();
  int64_t last = std::numeric_limits<int64_t>::max();
  int64_t stride = 1;

  // "100:2000", "100:", ":500", "500" (that step only) or "" (all). Throws InvalidArgument naming
  // the text for anything else, a negative bound, first > last or stride < 1.
  static StepSelection parse(const std::string& range, int64_t stride = 1);
  // The selected subset of `sorted` (ascending by step), order kept.
  std::vector<CheckpointInfo> select(const std::vector<CheckpointInfo>& sorted) const;
  std::string describe() const;  // "100:2000, stride 2" — for messages
};

// The step_<N> folders of `dir` (N a non-negative decimal integer) that hold a model.safetensors,
// sorted by N and thinned by `selection`; other entries are ignored. A folder without
// model.safetensors is an incomplete save (save_checkpoint writes that file last) and is skipped.
// Throws FormatError naming `dir` when it does not exist, is not a directory or has no
// checkpoint, or when two folders have the same N (step_7, step_07); InvalidArgument naming the
// range and the available steps when the selection keeps none.
//
// The other layouts: nanoGPT's files take the step from the name's digits (ckpt_<N>.pt) or else
// from the file's iter_num; Hugging Face folders and step_<N>.pt files from their names.
std::vector<CheckpointInfo> list_checkpoints(const std::string& dir,
                                             const StepSelection& selection = {},
                                             CheckpointLayout layout = CheckpointLayout::kAuto);

// A torch optimizer.state_dict() as saved: state keyed by parameter index, not yet mapped to the
// model's parameter names (see resolve_optimizer_state).
struct IndexedOptimizerState;

// A checkpoint in memory: tensors on the CPU as stored, meta.json parsed once into `meta`.
// meta.json is a JSON object: {"step": N, "optimizer": {"name": "adamw", "hyper": {"lr": 1e-3,
// ...}, "step_count": N, "muon_params": "...", "partition": {...}, "param_groups": [...]},
// "model": {model config as ModelConfig::to_json writes it}, ...anything else}.
// Checkpoints of the PyTorch layouts are converted on load into the same form: model tensors by
// name (torch.compile's "_orig_mod." prefix removed, nanoGPT's causal-mask buffers dropped), and a
// meta made from what the file records (model_args, iter_num, param_groups).
struct Checkpoint {
  int64_t step = 0;
  std::string path;  // the step_<N> folder (or the checkpoint's folder or file)
  // The model's tensors as a source (open_checkpoint): read into the parameters one tensor at a
  // time (fill_parameters, parameters_from). Unset once `model` holds them whole.
  SharedTensorSource model_source;
  NamedTensors model;      // model.safetensors, in file order, when read whole (load_checkpoint)
  NamedTensors optimizer;  // optimizer.safetensors when read whole; empty if the file is absent
  // The optimizer state as a source, "<param>.<key>" (open_checkpoint of a layout that reads it
  // lazily: native, DCP); saved_optimizer hands it on, so that a rebuilt step reads each
  // parameter's state when it takes that parameter's step. Unset when `optimizer` holds it.
  SharedTensorSource optimizer_source;
  CheckpointMeta meta;  // meta.json as parsed; empty if the file is absent
  // Where each part came from, for messages: "<path>/model.safetensors", "<file> ['model']", ...
  std::string model_file, optimizer_file, meta_file;
  // Where the model config came from: meta.json, a Hugging Face folder's config.json, or the
  // file's ['model_args']; "" when there is none.
  std::string model_config_file;
  // A torch optimizer's index-keyed state, until resolve_optimizer_state names it.
  std::shared_ptr<const IndexedOptimizerState> indexed_optimizer;

  // Views of `meta`; no parsing. Only hyper() can throw: FormatError naming meta.json and the
  // key when the stored value is not a number (load_checkpoint checked every other fixed key).
  std::string optimizer_name() const;         // optimizer.name, "" if absent
  std::optional<int64_t> step_count() const;  // optimizer.step_count
  // optimizer.hyper[key] if present (must be a number), else `fallback`.
  double hyper(const std::string& key, double fallback) const;
  std::string model_config_json() const;  // the "model" object as JSON text, "" if absent
  // meta.json as save_checkpoint writes it: the document as read with the typed fields put over
  // it (so resolve_optimizer_state's param_groups show); "{}" when there is none.
  std::string meta_json() const;
};

// Parses meta.json's text into the typed form, checking the fixed keys. FormatError naming
// `origin` and the key (with the value) for text that is not a JSON object, or a fixed key of the
// wrong type: "step" (integer), "model" (object), "optimizer" (object), "optimizer.name",
// "optimizer.muon_params", "optimizer.param_order" (strings), "optimizer.hyper" (object),
// "optimizer.step_count" (integer), "optimizer.partition" (object of strings),
// "optimizer.param_groups" (array of {"params": [names], "hyper": {key: number}}).
// Non-numeric entries of "optimizer.hyper" are kept and fail only when read (hyper_or).
CheckpointMeta parse_checkpoint_meta(const std::string& text, const std::string& origin);
// The JSON text of `meta` (indented as meta.json is written): the document as read
// with every typed field put over it.
std::string checkpoint_meta_json(const CheckpointMeta& meta);
// The checkpoint's optimizer state and record for optim and analysis, which do not read files.
SavedOptimizer saved_optimizer(const Checkpoint& ckpt);

// Reads model.safetensors, optimizer.safetensors and meta.json of `info.path`. Throws FormatError
// naming the file: unreadable safetensors, meta.json that is not valid JSON or not an object, a
// fixed key of the wrong type ("step", "optimizer", "optimizer.name", "optimizer.hyper",
// "optimizer.step_count", "model"), or a "step" that differs from the folder's N.
// The PyTorch layouts are read with load_torch_file's allow-list, so a checkpoint never runs code;
// FormatError names the file and key of anything malformed.
// kModelOnly leaves `optimizer` empty (Adam's state is twice the parameters): the native layout
// does not read optimizer.safetensors, the PyTorch layouts drop the state after reading.
enum class CheckpointParts { kAll, kModelOnly };
Checkpoint load_checkpoint(const CheckpointInfo& info,
                           CheckpointParts parts = CheckpointParts::kAll);
// The same with the model's tensors left in their files: `model_source` lists them and reads each
// on demand (`model` stays empty), so a model of any size is filled in place. Optimizer state and
// meta are read as load_checkpoint reads them. The same errors, each when its part is read.
Checkpoint open_checkpoint(const CheckpointInfo& info,
                           CheckpointParts parts = CheckpointParts::kAll);

// Names a torch optimizer's index-keyed state after the model's parameters: fills
// `ckpt.optimizer` ("<param>.<key>") and meta's optimizer.param_groups and param_order, and clears
// `indexed_optimizer` (no-op when it is empty). PyTorch numbers parameters by their position in
// param_groups, so `param_order` says how the groups were built from the model:
//  - "model": all groups together hold the model's parameters in model order;
//  - "ndim": two groups, parameters with ndim >= 2 then the rest, each in model order (nanoGPT's
//    configure_optimizers);
//  - "hidden": the matrices Muon orthogonalises by default (is_hidden_matrix), filling whole
//    groups, then the rest, each in model order (Keller Jordan's MuonWithAuxAdam setups);
//  - "modded": modded-nanogpt's state_step<N>.pt, whose two optimizers ('optimizers': AdamW,
//    Muon) are read as one Muon state with auxiliary AdamW groups: AdamW's [embed.weight],
//    [proj.weight], [ndim < 2 in model order], then Muon's block matrices in model order stably
//    sorted by shape, largest first (train_gpt_simple.py);
//  - "file:PATH": PATH lists the parameter names in index order, one per line;
//  - "trainer": the Hugging Face Trainer's two groups, the weight-decayed parameters and then the
//    rest, by the Trainer's get_decay_parameter_names (norm parameters by `structure`'s roles,
//    else by name; biases and names with norm in them);
//  - "auto": "modded" for modded-nanogpt's optimizers; else the names the optimizer recorded
//    (param_groups[].param_names, PyTorch >= 2.6) when every group has them, else "trainer" for
//    a Hugging Face Trainer's optimizer.pt when it fits, else whichever of "model", "ndim" and
//    "hidden" fits the group sizes and every state tensor's shape.
// InvalidArgument naming the optimizer file: a count or shape that fits no rule (optimizer state
// for a different model), an ambiguous "auto" (two rules fit and disagree), an unknown name in
// the order file (with the closest model names); modded-nanogpt state that is sharded across
// ranks (each rank's Muon keeps only its share) or not train_gpt_simple.py's [AdamW, Muon].
void resolve_optimizer_state(Checkpoint& ckpt, const ParamSpace& space,
                             const ParamOrderSpec& param_order,
                             const ModelStructure* structure = nullptr);
// The same with the rule as --param-order takes it (parse_param_order).
void resolve_optimizer_state(Checkpoint& ckpt, const ParamSpace& space,
                             const std::string& param_order = "auto",
                             const ModelStructure* structure = nullptr);
// The rules that rebuild saved torch optimizer states, one line each for help texts:
// "soap (pytorch-optimizer's SOAP): exp_avg, exp_avg_sq, GG, Q, ...", in recognition's order.
std::vector<std::string> torch_optimizer_rules();
// The rule of `ckpt`'s saved optimizer state, named by the user (--optimizer) rather than
// recognised from its keys: a torch state is checked against `rule` (its state keys and
// param_group keys must be the rule's: InvalidArgument naming the file and what differs), a
// state whose meta.json names another rule is an InvalidArgument naming both. `hyper` (libcurv's
// field names) replaces those saved values in every group; `muon_params` the partition. No-op for
// a checkpoint without optimizer state, or with `rule` empty.
void name_optimizer(Checkpoint& ckpt, const std::string& rule,
                    const std::vector<std::pair<std::string, double>>& hyper = {},
                    const std::optional<std::string>& muon_params = std::nullopt);

// InvalidOption naming the rule (as ParamOrderSpec) when it is kNames (auto's choice, never
// named) or file:PATH without PATH an existing file: checks the rule before any checkpoint is read.
void validate_param_order(const ParamOrderSpec& param_order);

// The parameters of `space` from `ckpt.model`, in the space's order, converted to the dtype and
// device of `like` (aligned with `space`; if `like` is empty, kept as stored). InvalidArgument
// naming model.safetensors when the model and the checkpoint do not fit:
//  - a model parameter missing from the file (with the closest names in the file);
//  - a tensor in the file that is not a model parameter (up to 5 listed, each with the closest
//    model names), unless `allow_extra`. Tolerated always: a tied parameter the model does not
//    have when the file's copy equals its source's (a tied head stored twice, as nanoGPT's
//    state_dict does). The tied pairs are `structure`'s (ModelStructure::tied); without one, or
//    when it names none, nanoGPT's ("lm_head.weight" tied to "transformer.wte.weight");
//  - a shape that differs (parameter and both shapes), or a non-floating tensor.
// Reads the model tensors from `ckpt.model_source` (or `ckpt.model`) when given either.
ParamVector parameters_from(const Checkpoint& ckpt, const ParamSpace& space,
                            const ParamVector& like, bool allow_extra = false,
                            const ModelStructure* structure = nullptr);
// The same checks, then each parameter read straight into `dest` (aligned with `space`: a model's
// own parameters, on any device and in any dtype), one tensor at a time: no copy of the whole
// checkpoint is ever held. Nothing is written when a check fails.
void fill_parameters(const Checkpoint& ckpt, const ParamSpace& space, const ParamVector& dest,
                     bool allow_extra = false, const ModelStructure* structure = nullptr);
// The bytes of the model's tensors (model_source or model).
int64_t model_bytes(const Checkpoint& ckpt);

// optimizer_state (curv/core/checkpoint_meta.h) on saved_optimizer(ckpt): the same lookups,
// messages naming optimizer.safetensors (or the file the state came from).
at::Tensor optimizer_state(const Checkpoint& ckpt, const std::string& param,
                           const std::string& key);
at::Tensor optimizer_state(const Checkpoint& ckpt, const ParamInfo& param, const std::string& key,
                           bool required = false);

// Writes `text` to `path` by the protocol of write_safetensors (PATH.tmp, fsync, rename), so a
// reader sees the old file or the whole new one; FormatError naming the file on failure.
void write_text_atomically(const std::string& path, const std::string& text);

// Writes DIR/step_<N>/ (directories created), each file atomically: optimizer.safetensors (or
// removes a stale one when `optimizer_state` is empty), meta.json, then model.safetensors. An
// existing model.safetensors is removed first and the new one written last, so a crash mid-save
// leaves a folder that list_checkpoints skips, never a mix of two saves. `meta_json` is a JSON
// object or "" ({}): its "step" is set to N (InvalidArgument if it holds another value).
// InvalidArgument for a negative step, params not matching the space (count or shapes) or bad
// meta_json; FormatError if a file cannot be written.
void save_checkpoint(const std::string& dir, int64_t step, const ParamSpace& space,
                     const ParamVector& params, const NamedTensors& optimizer_state,
                     const std::string& meta_json = "");
// The same with the metadata typed (checkpoint_meta_json writes it); its step, when set, must be N.
void save_checkpoint(const std::string& dir, int64_t step, const ParamSpace& space,
                     const ParamVector& params, const NamedTensors& optimizer_state,
                     const CheckpointMeta& meta);

}  // namespace curv
