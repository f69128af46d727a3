// The checkpoint reads of a probe run, each checkpoint's files read once where that can be
// arranged: the checkpoints the next turn of the loop needs (the next selected one, and its
// successor when the delta goes there) are opened on background threads while the current
// checkpoint's units compute, and their model tensors read into host memory while the bytes held
// ahead stay within a budget (ProbeRunOptions::prefetch_bytes); the model tensors read for a
// delta's successor are kept for the successor's own turn on the same terms. A checkpoint beyond
// the budget stays in its files and is read into the parameters at its turn. A read that fails in
// the background fails where its checkpoint is needed, with the error a direct read gives.
#pragma once

#include <atomic>
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
  // kept. `budget`: the model bytes held ahead at most. `digest_kind`: what digest() reads.
  CheckpointReader(bool prefetch, int64_t budget, DigestKind digest_kind)
      : prefetch_(prefetch), budget_(budget), digest_kind_(digest_kind) {}
  ~CheckpointReader();  // waits for the reads in flight
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // checkpoint_digest(info, digest_kind), from a background read when one was started; of the
  // kind of `like` instead when that is a digest of the other kind (a file resumed with or
  // without --full-digest).
  std::string digest(const CheckpointInfo& info, const std::string& like = "");
  // open_checkpoint(info, parts), handed over from a background read or a kept checkpoint that
  // holds at least `parts` (the optimizer state dropped when only the model was asked for); its
  // model tensors in memory when they were read ahead.
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
  int64_t held_bytes() const;                           // model bytes held ahead now

 private:
  using Shared = std::shared_ptr<Checkpoint>;
  struct Entry {
    std::shared_future<std::string> digest;  // not valid(): not read
    std::shared_future<Shared> ckpt;         // not valid(): not read, or handed over
    CheckpointParts parts = CheckpointParts::kModelOnly;
    std::shared_ptr<std::atomic<int64_t>> held;  // model bytes it holds in memory
  };
  // Reads `ckpt`'s model tensors into memory when `bytes` more fit the budget, counting them in
  // `held`; otherwise leaves them in their files.
  void hold_if_it_fits(Checkpoint& ckpt, std::atomic<int64_t>& held);
  // Gives back what `entry` held.
  void release(Entry& entry);

  bool prefetch_;
  int64_t budget_;
  DigestKind digest_kind_;
  std::atomic<int64_t> reserved_{0};
  std::map<std::string, Entry> entries_;
  int64_t reads_saved_ = 0;
};

}  // namespace curv
