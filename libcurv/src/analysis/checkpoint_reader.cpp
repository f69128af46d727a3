#include "analysis/checkpoint_reader.h"

#include <utility>

namespace curv {

namespace {

bool covers(CheckpointParts have, CheckpointParts want) {
  return have == CheckpointParts::kAll || want == CheckpointParts::kModelOnly;
}

// Waits for a read nobody asks for any more: its error is no one's.
template <class T>
void wait_quietly(const std::shared_future<T>& read) {
  try {
    if (read.valid()) read.get();
  } catch (...) {
  }
}

}  // namespace

CheckpointReader::~CheckpointReader() {
  for (auto& [path, entry] : entries_) {
    wait_quietly(entry.digest);
    wait_quietly(entry.ckpt);
  }
}

std::string CheckpointReader::digest(const CheckpointInfo& info) {
  auto it = entries_.find(info.path);
  if (it != entries_.end() && it->second.digest.valid()) return it->second.digest.get();
  return checkpoint_digest(info);
}

Checkpoint CheckpointReader::load(const CheckpointInfo& info, CheckpointParts parts) {
  auto it = entries_.find(info.path);
  if (it != entries_.end() && it->second.ckpt.valid() && covers(it->second.parts, parts)) {
    const Shared shared = std::exchange(it->second.ckpt, {}).get();  // rethrows a read's error
    Checkpoint ckpt = std::move(*shared);
    if (parts == CheckpointParts::kModelOnly) ckpt.optimizer.clear();
    ++reads_saved_;
    return ckpt;
  }
  return load_checkpoint(info, parts);
}

void CheckpointReader::keep(const CheckpointInfo& info, CheckpointParts parts, Checkpoint ckpt) {
  if (!prefetch_) return;
  Entry& entry = entries_[info.path];
  wait_quietly(entry.ckpt);
  std::promise<Shared> ready;
  ready.set_value(std::make_shared<Checkpoint>(std::move(ckpt)));
  entry.ckpt = ready.get_future().share();
  entry.parts = parts;
}

void CheckpointReader::prefetch(const CheckpointInfo& info, CheckpointParts parts,
                                bool with_digest) {
  if (!prefetch_) return;
  Entry& entry = entries_[info.path];
  if (with_digest && !entry.digest.valid()) {
    entry.digest =
        std::async(std::launch::async, [info] { return checkpoint_digest(info); }).share();
  }
  if (!entry.ckpt.valid() || !covers(entry.parts, parts)) {
    wait_quietly(entry.ckpt);
    entry.ckpt = std::async(std::launch::async, [info, parts] {
                   return std::make_shared<Checkpoint>(load_checkpoint(info, parts));
                 }).share();
    entry.parts = parts;
  }
}

void CheckpointReader::set_prefetch(bool on) {
  prefetch_ = on;
  if (!on) retain({});
}

void CheckpointReader::retain(const std::set<std::string>& paths) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (paths.count(it->first)) {
      ++it;
    } else {
      wait_quietly(it->second.digest);
      wait_quietly(it->second.ckpt);
      it = entries_.erase(it);
    }
  }
}

}  // namespace curv
