// The checkpoint-layout registry, and listing, detection and loading through it.
#include "curv/io/checkpoint_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <mutex>

#include "core/strings.h"
#include "curv/core/error.h"
#include "io/builtin_layouts.h"

namespace curv {

namespace fs = std::filesystem;

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<const CheckpointLayoutReader>> entries;
};

// Built-ins are listed here rather than self-registered from static initialisers, which a
// static link would drop along with their otherwise unreferenced object files.
Registry& registry() {
  static Registry* r = [] {
    auto* out = new Registry;
    out->entries = {native_layout(),      nanogpt_layout(),     hf_layout(),
                    torch_steps_layout(), torchtitan_layout(),  accelerate_layout(),
                    deepspeed_layout(),   hf_revisions_layout()};
    return out;
  }();
  return *r;
}

std::vector<std::shared_ptr<const CheckpointLayoutReader>> layouts() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.entries;
}

// "a, b or c".
std::string one_of(std::vector<std::string> items) {
  if (items.size() < 2) return join(items, "");
  const std::string last = items.back();
  items.pop_back();
  return join(items, ", ") + " or " + last;
}

// The names in `dir`, sorted; FormatError naming `dir` when it is missing or not a directory.
std::vector<std::string> entries_of(const std::string& dir) {
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  if (!fs::exists(status))
    throw FormatError(fmt::format("checkpoint directory {} does not exist", dir));
  if (!fs::is_directory(status)) {
    throw FormatError(fmt::format("checkpoint directory {} is not a directory", dir));
  }
  std::vector<std::string> names;
  try {
    for (const auto& entry : fs::directory_iterator(dir))
      names.push_back(entry.path().filename().string());
  } catch (const fs::filesystem_error& e) {
    throw FormatError(fmt::format("checkpoint directory {}: cannot list: {}", dir, e.what()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A common slip is to pass one checkpoint's folder instead of the run's directory.
std::string one_checkpoint_hint(bool looks_like_one) {
  return looks_like_one ? " (this looks like a single checkpoint folder: pass its parent)" : "";
}

// `found` sorted by step; FormatError naming `dir` when it is empty or two share a step.
std::vector<CheckpointInfo> sorted_unique(std::vector<CheckpointInfo> found, const std::string& dir,
                                          const CheckpointLayoutReader& layout) {
  if (found.empty()) {
    throw FormatError(fmt::format("no checkpoints in {}: expected {}{}", dir, layout.expected(),
                                  one_checkpoint_hint(layout.looks_like_one_checkpoint(dir))));
  }
  std::stable_sort(
      found.begin(), found.end(),
      [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  for (size_t i = 1; i < found.size(); ++i) {
    if (found[i].step == found[i - 1].step) {
      const bool folders = fs::is_directory(found[i - 1].path) && fs::is_directory(found[i].path);
      throw FormatError(fmt::format("checkpoint directory {}: {}{} and {} are both step {}", dir,
                                    folders ? "folders " : "",
                                    fs::path(found[i - 1].path).filename().string(),
                                    fs::path(found[i].path).filename().string(), found[i].step));
    }
  }
  return found;
}

// The selection of `found` (sorted, not empty); InvalidArgument when it keeps none.
std::vector<CheckpointInfo> select_some(const std::vector<CheckpointInfo>& found,
                                        const StepSelection& selection, const std::string& dir) {
  auto selected = selection.select(found);
  if (selected.empty()) {
    throw InvalidArgument(fmt::format(
        "checkpoint steps {} select none of the {} checkpoints in {} (steps {} to {})",
        selection.describe(), found.size(), dir, found.front().step, found.back().step));
  }
  return selected;
}

}  // namespace

void register_checkpoint_layout(std::shared_ptr<const CheckpointLayoutReader> layout) {
  if (!layout) throw InvalidArgument("register_checkpoint_layout: null layout");
  const std::string name = layout->name();
  if (name == CheckpointLayout::kAuto.name()) {
    throw InvalidArgument("register_checkpoint_layout: 'auto' is not a layout name");
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& e : r.entries) {
    if (e->name() == name) {
      throw InvalidArgument(
          fmt::format("register_checkpoint_layout: layout '{}' is already registered", name));
    }
  }
  r.entries.push_back(std::move(layout));
}

std::vector<std::string> checkpoint_layout_names() {
  std::vector<std::string> names;
  for (const auto& e : layouts()) names.push_back(e->name());
  return names;
}

const CheckpointLayoutReader& find_checkpoint_layout(const CheckpointLayout& layout) {
  for (const auto& e : layouts()) {
    if (e->name() == layout.name()) return *e;
  }
  throw InvalidArgument(fmt::format("checkpoint layout '{}' is not registered; registered: {}",
                                    layout.name(), join(checkpoint_layout_names(), ", ")));
}

CheckpointLayout parse_checkpoint_layout(const std::string& text) {
  std::vector<std::string> names = {CheckpointLayout::kAuto.name()};
  for (const auto& name : checkpoint_layout_names()) names.push_back(name);
  if (std::find(names.begin(), names.end(), text) == names.end()) {
    throw InvalidArgument(fmt::format("checkpoint layout '{}': expected {}", text, one_of(names)));
  }
  return CheckpointLayout(text);
}

std::string layout_name(const CheckpointLayout& layout) { return layout.name(); }

CheckpointLayout detect_checkpoint_layout(const std::string& dir) {
  const auto all = layouts();
  std::vector<std::string> example(all.size());  // an entry of each layout present
  for (const auto& name : entries_of(dir)) {
    const std::string path = dir + "/" + name;
    for (size_t k = 0; k < all.size(); ++k) {
      if (all[k]->holds(path, name)) {
        if (example[k].empty()) example[k] = name;
        break;
      }
    }
  }
  std::vector<size_t> present;
  for (size_t k = 0; k < all.size(); ++k) {
    if (example[k].empty()) continue;
    if (all[k]->outranks_others()) return CheckpointLayout(all[k]->name());
    present.push_back(k);
  }
  if (present.size() == 1) return CheckpointLayout(all[present[0]]->name());
  if (present.empty()) {
    std::vector<std::string> expected;
    bool looks_like_one = false;
    for (const auto& layout : all) {
      expected.push_back(fmt::format("{} ({})", layout->brief(), layout->name()));
      looks_like_one = looks_like_one || layout->looks_like_one_checkpoint(dir);
    }
    throw FormatError(fmt::format("no checkpoints in {}: expected {}{}", dir, one_of(expected),
                                  one_checkpoint_hint(looks_like_one)));
  }
  std::vector<std::string> found;
  for (size_t k : present) found.push_back(fmt::format("{} ({})", all[k]->name(), example[k]));
  throw FormatError(
      Error::literal(fmt::format("checkpoint directory {} holds checkpoints of several layouts: "
                                 "{}; choose one with ",
                                 dir, join(found, ", "))) +
          "{0}",
      {{"ProbeRunOptions.layout", ""}});
}

std::vector<CheckpointInfo> list_checkpoints(const std::string& dir, const StepSelection& selection,
                                             CheckpointLayout layout) {
  if (layout == CheckpointLayout::kAuto) layout = detect_checkpoint_layout(dir);
  const CheckpointLayoutReader& reader = find_checkpoint_layout(layout);
  std::vector<CheckpointInfo> found;
  for (const auto& name : entries_of(dir)) {
    const std::string path = (fs::path(dir) / name).string();
    if (reader.holds(path, name)) found.push_back({reader.step(path, name), path, layout});
  }
  return select_some(sorted_unique(std::move(found), dir, reader), selection, dir);
}

namespace {

// open() and load() are each made from the other by default; a layout that overrides neither
// would recurse, which this depth guard turns into an error naming it.
// Per layout object, so that a layout delegating to another is not mistaken for one.
thread_local std::vector<const CheckpointLayoutReader*> in_default;

struct DefaultGuard {
  explicit DefaultGuard(const CheckpointLayoutReader& layout) : layout_(&layout) {
    if (std::find(in_default.begin(), in_default.end(), layout_) != in_default.end()) {
      throw InvalidArgument(
          fmt::format("checkpoint layout '{}' overrides neither open() nor load()", layout.name()));
    }
    in_default.push_back(layout_);
  }
  ~DefaultGuard() { in_default.pop_back(); }
  const CheckpointLayoutReader* layout_;
  DefaultGuard(const DefaultGuard&) = delete;
  DefaultGuard& operator=(const DefaultGuard&) = delete;
};

void drop_optimizer(Checkpoint& ckpt, CheckpointParts parts) {
  if (parts == CheckpointParts::kModelOnly) {
    ckpt.optimizer.clear();
    ckpt.optimizer_source.reset();
    ckpt.indexed_optimizer.reset();
  }
}

}  // namespace

Checkpoint CheckpointLayoutReader::open(const CheckpointInfo& info, CheckpointParts parts) const {
  const DefaultGuard guard(*this);
  Checkpoint ckpt = load(info, parts);
  const std::string origin = ckpt.model_file.empty() ? info.path : ckpt.model_file;
  ckpt.model_source = memory_tensor_source(std::move(ckpt.model), origin);
  ckpt.model.clear();
  return ckpt;
}

Checkpoint CheckpointLayoutReader::load(const CheckpointInfo& info, CheckpointParts parts) const {
  const DefaultGuard guard(*this);
  Checkpoint ckpt = open(info, parts);
  if (ckpt.model_source) {
    ckpt.model = read_all(*ckpt.model_source);
    ckpt.model_source.reset();
  }
  if (ckpt.optimizer_source) {
    ckpt.optimizer = read_all(*ckpt.optimizer_source);
    ckpt.optimizer_source.reset();
  }
  return ckpt;
}

Checkpoint load_checkpoint(const CheckpointInfo& info, CheckpointParts parts) {
  Checkpoint ckpt = find_checkpoint_layout(info.layout).load(info, parts);
  drop_optimizer(ckpt, parts);
  return ckpt;
}

Checkpoint open_checkpoint(const CheckpointInfo& info, CheckpointParts parts) {
  Checkpoint ckpt = find_checkpoint_layout(info.layout).open(info, parts);
  drop_optimizer(ckpt, parts);
  return ckpt;
}

std::optional<int64_t> step_number(const std::string& text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

}  // namespace curv
