// The checkpoint-layout registry: each way a run directory can store its checkpoints (native,
// nanoGPT, Hugging Face, step_<N>.pt, or one registered by a program) is one entry that
// recognises its entries, gives their steps and loads them; list_checkpoints and load_checkpoint
// go through it and know no layout by name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "curv/io/checkpoint.h"

namespace curv {

// One layout. Detection and listing look at the entries of a run directory one by one; loading
// converts one listed checkpoint into the native form (Checkpoint).
class CheckpointLayoutReader {
 public:
  virtual ~CheckpointLayoutReader() = default;
  // The name --layout takes and CheckpointInfo::layout holds; not "auto".
  virtual std::string name() const = 0;
  // The entries it reads, for messages: `brief` in the list detection gives when it finds no
  // layout ("ckpt.pt or ckpt_*.pt"), `expected` when listing finds none of this layout's ("ckpt.pt
  // or ckpt_*.pt files").
  virtual std::string brief() const = 0;
  virtual std::string expected() const { return brief(); }
  // Whether `path`, the entry `entry` of a run directory, is a checkpoint of this layout, from its
  // name and file type only: detection asks it of every entry.
  virtual bool holds(const std::string& path, const std::string& entry) const = 0;
  // The step of an entry holds() accepted; it may read the file. FormatError naming the file.
  virtual int64_t step(const std::string& path, const std::string& entry) const = 0;
  // Whether `dir` looks like one checkpoint of this layout rather than a run directory: messages
  // then suggest passing its parent.
  virtual bool looks_like_one_checkpoint(const std::string&) const { return false; }
  // Whether detection chooses this layout whenever the directory holds one of its checkpoints,
  // whatever else it holds (the native layout: a run may keep other tools' exports beside it).
  virtual bool outranks_others() const { return false; }
  // The checkpoint `info` (listed by this layout) in the native form, its model tensors as a
  // source (Checkpoint::model_source, read on demand by fill_parameters), meta made from what the
  // files record, a torch optimizer's state indexed until resolve_optimizer_state names it.
  // kModelOnly may skip reading the optimizer state (open_checkpoint drops it either way).
  // FormatError naming the file and key. A layout overrides open() or load() (or both): by
  // default each is made from the other.
  virtual Checkpoint open(const CheckpointInfo& info, CheckpointParts parts) const;
  // The same with the model tensors read whole into Checkpoint::model (load_checkpoint).
  virtual Checkpoint load(const CheckpointInfo& info, CheckpointParts parts) const;
};

// Adds a layout, after the built-ins in detection order; InvalidArgument if its name is taken
// (or is "auto").
void register_checkpoint_layout(std::shared_ptr<const CheckpointLayoutReader> layout);
// The layout named `layout`; InvalidArgument naming it and listing the registered ones.
const CheckpointLayoutReader& find_checkpoint_layout(const CheckpointLayout& layout);
// Registered names in registration order (native, nanogpt, hf, pt first).
std::vector<std::string> checkpoint_layout_names();

}  // namespace curv
