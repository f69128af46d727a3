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

std::string CheckpointReader::digest(const CheckpointInfo& info, const std::string& like) {
  if (!like.empty() && digest_kind_of(like) != digest_kind_) {
    return checkpoint_digest(info, digest_kind_of(like));
  }
  auto it = entries_.find(info.path);
  if (it != entries_.end() && it->second.digest.valid()) return it->second.digest.get();
  return checkpoint_digest(info, digest_kind_);
}

void CheckpointReader::hold_if_it_fits(Checkpoint& ckpt, std::atomic<int64_t>& held) {
  if (!ckpt.model_source) return;  // already whole in memory (a layout that reads whole)
  const int64_t bytes = model_bytes(ckpt);
  int64_t now = reserved_.load();
  do {
    if (now + bytes > budget_) return;
  } while (!reserved_.compare_exchange_weak(now, now + bytes));
  held += bytes;
  ckpt.model = read_all(*ckpt.model_source);
  ckpt.model_source.reset();
}

void CheckpointReader::release(Entry& entry) {
  if (entry.held) reserved_ -= entry.held->exchange(0);
}

int64_t CheckpointReader::held_bytes() const { return reserved_.load(); }

Checkpoint CheckpointReader::load(const CheckpointInfo& info, CheckpointParts parts) {
  auto it = entries_.find(info.path);
  if (it != entries_.end() && it->second.ckpt.valid() && covers(it->second.parts, parts)) {
    Entry& entry = it->second;
    const Shared shared = std::exchange(entry.ckpt, {}).get();  // rethrows a read's error
    release(entry);  // the checkpoint is the caller's now
    Checkpoint ckpt = std::move(*shared);
    if (parts == CheckpointParts::kModelOnly) {
      ckpt.optimizer.clear();
      ckpt.optimizer_source.reset();
    }
    ++reads_saved_;
    return ckpt;
  }
  return open_checkpoint(info, parts);
}

void CheckpointReader::keep(const CheckpointInfo& info, CheckpointParts parts, Checkpoint ckpt) {
  if (!prefetch_) return;
  Entry& entry = entries_[info.path];
  wait_quietly(entry.ckpt);
  release(entry);
  entry.held = std::make_shared<std::atomic<int64_t>>(0);
  if (ckpt.model_source == nullptr && !ckpt.model.empty()) {
    // Tensors already read: kept while they fit the budget, else left to be read again.
    const int64_t bytes = model_bytes(ckpt);
    if (reserved_ + bytes > budget_) {
      entry.ckpt = {};
      return;
    }
    reserved_ += bytes;
    *entry.held = bytes;
  }
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
    entry.digest = std::async(std::launch::async, [info, kind = digest_kind_] {
                     return checkpoint_digest(info, kind);
                   }).share();
  }
  if (!entry.ckpt.valid() || !covers(entry.parts, parts)) {
    wait_quietly(entry.ckpt);
    release(entry);
    auto held = std::make_shared<std::atomic<int64_t>>(0);
    entry.held = held;
    entry.ckpt = std::async(std::launch::async, [this, info, parts, held] {
                   auto ckpt = std::make_shared<Checkpoint>(open_checkpoint(info, parts));
                   hold_if_it_fits(*ckpt, *held);
                   return ckpt;
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
      release(it->second);
      it = entries_.erase(it);
    }
  }
}

}  // namespace curv
