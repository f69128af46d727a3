// The checkpoint reads of a probe run, each checkpoint's files read once where that can be
// arranged: the checkpoints the next turn of the loop needs (the next selected one, and its
// successor when the delta goes there) are read on background threads while the current
// checkpoint's units compute, and the model tensors read for a delta's successor are kept for the
// successor's own turn. A read that fails in the background fails where its checkpoint is needed,
// with the error a direct read gives.
#pragma once

#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "curv/io/checkpoint.h"

namespace curv {

class CheckpointReader {
 public:
  // prefetch = false: every read happens when asked for, on the calling thread, and nothing is
  // kept.
  explicit CheckpointReader(bool prefetch) : prefetch_(prefetch) {}
  ~CheckpointReader();  // waits for the reads in flight
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // checkpoint_digest(info), from a background read when one was started.
  std::string digest(const CheckpointInfo& info);
  // load_checkpoint(info, parts), handed over from a background read or a kept checkpoint that
  // holds at least `parts` (the optimizer state dropped when only the model was asked for).
  Checkpoint load(const CheckpointInfo& info, CheckpointParts parts);
  // Keeps `ckpt`, read with `parts`, for a later load() of the same checkpoint.
  void keep(const CheckpointInfo& info, CheckpointParts parts, Checkpoint ckpt);
  // Starts reading info's digest (with_digest) and its `parts` in the background, each unless it
  // is there already.
  void prefetch(const CheckpointInfo& info, CheckpointParts parts, bool with_digest);
  // Drops what is held or read for checkpoints other than `paths`.
  void retain(const std::set<std::string>& paths);

  // Switches reading ahead on or off; off drops whatever is held.
  void set_prefetch(bool on);
  bool prefetching() const { return prefetch_; }
  int64_t reads_saved() const { return reads_saved_; }  // loads served without a read then

 private:
  using Shared = std::shared_ptr<Checkpoint>;
  struct Entry {
    std::shared_future<std::string> digest;  // not valid(): not read
    std::shared_future<Shared> ckpt;         // not valid(): not read, or handed over
    CheckpointParts parts = CheckpointParts::kModelOnly;
  };
  bool prefetch_;
  std::map<std::string, Entry> entries_;
  int64_t reads_saved_ = 0;
};

}  // namespace curv
