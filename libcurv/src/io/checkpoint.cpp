#include "curv/io/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/io/safetensors.h"
#include "curv/io/torch_file.h"
#include "io/builtin_layouts.h"

namespace curv {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kMetaFile = "meta.json";
constexpr size_t kMaxListed = 5;

std::string file_in(const std::string& folder, const char* name) { return folder + "/" + name; }

// The origin of a part of `ckpt` for messages: the field load_checkpoint set, else the native name.
std::string origin_of(const Checkpoint& ckpt, const std::string& field, const char* native) {
  return field.empty() ? file_in(ckpt.path, native) : field;
}

std::vector<std::string> first_few(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (size_t i = 0; i < std::min(items.size(), kMaxListed); ++i)
    out.push_back("'" + items[i] + "'");
  if (items.size() > kMaxListed) out.push_back(fmt::format("... ({} in all)", items.size()));
  return out;
}

}  // namespace

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](const char* what) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw FormatError(fmt::format("{}: cannot write ({} {}): {}", path, what, tmp, reason));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) fail("create");
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail("write");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("fsync");
  }
  if (::close(fd) != 0) fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
}

// ---------------------------------------------------------------------------------------------
// Step selection

StepSelection StepSelection::parse(const std::string& range, int64_t stride) {
  StepSelection s;
  if (stride < 1) {
    throw InvalidArgument(fmt::format("checkpoint stride {} must be >= 1", stride));
  }
  s.stride = stride;
  if (range.empty()) return s;
  auto bad = [&](const std::string& why) {
    return InvalidArgument(
        fmt::format("checkpoint step range '{}': {} (expected FIRST:LAST, "
                    "FIRST:, :LAST or STEP, with non-negative integers)",
                    range, why));
  };
  auto number = [&](const std::string& text) {
    auto value = step_number(text);
    if (!value) throw bad(fmt::format("'{}' is not a non-negative integer", text));
    return *value;
  };
  const auto colon = range.find(':');
  if (colon == std::string::npos) {
    s.first = s.last = number(range);
    return s;
  }
  if (range.find(':', colon + 1) != std::string::npos) throw bad("more than one ':'");
  const std::string first = range.substr(0, colon), last = range.substr(colon + 1);
  if (!first.empty()) s.first = number(first);
  if (!last.empty()) s.last = number(last);
  if (s.first > s.last)
    throw bad(fmt::format("first step {} is after last step {}", s.first, s.last));
  return s;
}

std::vector<CheckpointInfo> StepSelection::select(const std::vector<CheckpointInfo>& sorted) const {
  std::vector<CheckpointInfo> out;
  int64_t position = 0;  // among those in range
  for (const auto& info : sorted) {
    if (info.step < first || info.step > last) continue;
    if (position++ % std::max<int64_t>(stride, 1) == 0) out.push_back(info);
  }
  return out;
}

std::string StepSelection::describe() const {
  const bool open_first = first == std::numeric_limits<int64_t>::min();
  const bool open_last = last == std::numeric_limits<int64_t>::max();
  std::string text =
      (open_first ? "" : std::to_string(first)) + ":" + (open_last ? "" : std::to_string(last));
  if (open_first && open_last) text = "all steps";
  if (stride != 1) text += fmt::format(", stride {}", stride);
  return text;
}

SavedOptimizer saved_optimizer(const Checkpoint& ckpt) {
  SavedOptimizer saved;
  saved.checkpoint = ckpt.path;
  saved.step = ckpt.step;
  saved.file = origin_of(ckpt, ckpt.optimizer_file, kOptimizerFile);
  if (ckpt.optimizer_source) {
    saved.state = ckpt.optimizer_source;
  } else if (!ckpt.optimizer.empty()) {
    saved.state = memory_tensor_source(ckpt.optimizer, saved.file);
  }
  saved.meta_file = origin_of(ckpt, ckpt.meta_file, kMetaFile);
  if (ckpt.meta.optimizer) saved.record = *ckpt.meta.optimizer;
  saved.unresolved = ckpt.indexed_optimizer != nullptr;
  return saved;
}

namespace {

// Every regular file of a checkpoint: a folder's, in its subfolders too, by relative path; or the
// file itself.
std::vector<std::pair<std::string, fs::path>> checkpoint_files(const std::string& path) {
  std::vector<std::pair<std::string, fs::path>> files;
  if (fs::is_directory(path)) {
    for (const auto& entry : fs::recursive_directory_iterator(path)) {
      if (entry.is_regular_file()) {
        files.emplace_back(fs::relative(entry.path(), path).string(), entry.path());
      }
    }
    std::sort(files.begin(), files.end());
  } else {
    files.emplace_back(fs::path(path).filename().string(), path);
  }
  return files;
}

// Reads and hashes ranges of one file; FormatError naming it when a read fails.
class FileHasher {
 public:
  explicit FileHasher(const fs::path& file) : path_(file.string()), in_(file, std::ios::binary) {
    if (!in_) throw FormatError(fmt::format("cannot read '{}'", path_));
  }
  void add(uLong& crc, uint64_t offset, uint64_t n) {
    std::vector<char> buffer(static_cast<size_t>(std::min<uint64_t>(n, 1 << 20)));
    in_.seekg(static_cast<std::streamoff>(offset));
    while (n > 0 && in_) {
      in_.read(buffer.data(), static_cast<std::streamsize>(std::min<uint64_t>(n, buffer.size())));
      const auto got = static_cast<uInt>(in_.gcount());
      crc = crc32(crc, reinterpret_cast<const Bytef*>(buffer.data()), got);
      n -= got;
      if (got == 0) break;
    }
    if (n > 0) throw FormatError(fmt::format("cannot read '{}'", path_));
  }
  std::string head(uint64_t n) {
    std::string out(n, '\0');
    in_.seekg(0);
    in_.read(out.data(), static_cast<std::streamsize>(n));
    out.resize(static_cast<size_t>(in_.gcount()));
    in_.clear();
    return out;
  }

 private:
  std::string path_;
  std::ifstream in_;
};

void add_text(uLong& crc, const std::string& text) {
  crc = crc32(crc, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size()));
}

// What one file records about its content (DigestKind::kRecorded).
void add_recorded(uLong& crc, const fs::path& file, uint64_t size) {
  constexpr uint64_t kSmall = uint64_t{1} << 20, kBlock = uint64_t{64} << 10, kBlocks = 16;
  FileHasher hasher(file);
  if (size <= kSmall) {
    hasher.add(crc, 0, size);
    return;
  }
  const std::string head = hasher.head(8);
  const std::string name = file.filename().string();
  if (head.compare(0, 4, "PK\x03\x04") == 0 && name.size() > 7 &&
      name.substr(name.size() - 7) != ".distcp") {
    try {
      add_text(crc, fmt::format("zip:{:08x}", torch_file_directory_crc(file.string())));
      return;
    } catch (const FormatError&) {
      // Not one zip archive (records concatenated): sampled below.
    }
  }
  if (head.size() == 8 && name.size() > 12 && name.substr(name.size() - 12) == ".safetensors") {
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<uint8_t>(head[i]);
    if (header <= size - 8) hasher.add(crc, 0, 8 + header);
  }
  for (uint64_t i = 0; i < kBlocks; ++i)
    hasher.add(crc, i * (size - kBlock) / (kBlocks - 1), kBlock);
}

}  // namespace

std::string checkpoint_digest(const CheckpointInfo& info, DigestKind kind) {
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t total = 0;
  for (const auto& [relative, file] : checkpoint_files(info.path)) {
    std::error_code ec;
    const uint64_t size = fs::file_size(file, ec);
    if (ec) throw FormatError(fmt::format("cannot read '{}'", file.string()));
    total += size;
    if (kind == DigestKind::kFull) {
      FileHasher(file).add(crc, 0, size);
      continue;
    }
    add_text(crc, fmt::format("{}:{}:", relative, size));
    add_recorded(crc, file, size);
  }
  return fmt::format("{}:{:08x} bytes:{}", kind == DigestKind::kFull ? "crc32" : "recorded",
                     static_cast<uint32_t>(crc), total);
}

DigestKind digest_kind_of(const std::string& digest) {
  return digest.rfind("crc32:", 0) == 0 ? DigestKind::kFull : DigestKind::kRecorded;
}

std::string Checkpoint::optimizer_name() const {
  return meta.optimizer ? meta.optimizer->name : "";
}

std::optional<int64_t> Checkpoint::step_count() const {
  return meta.optimizer ? meta.optimizer->step_count : std::nullopt;
}

double Checkpoint::hyper(const std::string& key, double fallback) const {
  if (!meta.optimizer) return fallback;
  return meta.optimizer->hyper_or(key, fallback, origin_of(*this, meta_file, kMetaFile));
}

std::string Checkpoint::model_config_json() const { return meta.model_json; }

std::string Checkpoint::meta_json() const { return checkpoint_meta_json(meta); }

// ---------------------------------------------------------------------------------------------
// Matching a checkpoint to a model

namespace {

// The model tensors of `ckpt` as a source: its model_source, or its tensors in memory.
SharedTensorSource model_tensors(const Checkpoint& ckpt) {
  if (ckpt.model_source) return ckpt.model_source;
  return memory_tensor_source(ckpt.model, origin_of(ckpt, ckpt.model_file, kModelFile));
}

// InvalidArgument naming `file` unless `source` holds every parameter of `space` with its shape
// and a floating dtype, and nothing else (see parameters_from).
void check_fit(const TensorSource& source, const std::string& file, const ParamSpace& space,
               bool allow_extra, const ModelStructure* structure) {
  std::vector<std::string> file_names;
  for (const auto& e : source.entries()) file_names.push_back(e.name);
  std::vector<std::string> missing;
  for (const auto& p : space.params()) {
    if (!source.find(p.name)) missing.push_back(p.name);
  }
  if (!missing.empty()) {
    throw InvalidArgument(fmt::format(
        "{}: model parameter '{}' is missing{}{}", file, missing.front(),
        did_you_mean(missing.front(), file_names),
        missing.size() == 1
            ? ""
            : fmt::format("; {} of the model's {} parameters are missing: {}", missing.size(),
                          space.size(), join(first_few(missing), ", "))));
  }

  // nanoGPT's state_dict stores a tied head twice, under both names; equal values prove it is
  // the same tensor, different values mean the checkpoint was trained with an untied head. The
  // model's structure names its tied pairs; one that names none (a TorchScript model's, whose
  // roles come from name rules) keeps nanoGPT's.
  const std::vector<std::pair<std::string, std::string>> nanogpt_tied = {
      {"lm_head.weight", "transformer.wte.weight"}};
  const auto& tied = structure && !structure->tied.empty() ? structure->tied : nanogpt_tied;
  std::vector<std::string> extra;
  for (const auto& name : file_names) {
    if (space.find(name)) continue;
    const auto pair = std::find_if(tied.begin(), tied.end(), [&](const auto& p) {
      return p.first == name && space.find(p.second) && source.find(p.second);
    });
    if (pair != tied.end()) {
      if (at::equal(source.read(name), source.read(pair->second))) continue;
      if (!allow_extra) {
        throw InvalidArgument(fmt::format(
            "{}: '{}' differs from '{}', so the checkpoint has an untied head but the model is "
            "tied (set \"tied\": false in the model config)",
            file, name, pair->second));
      }
    }
    extra.push_back(name);
  }
  if (!extra.empty() && !allow_extra) {
    const auto model_names = space.names();
    std::vector<std::string> described;
    for (size_t i = 0; i < std::min(extra.size(), kMaxListed); ++i) {
      described.push_back("'" + extra[i] + "'" + did_you_mean(extra[i], model_names, 2));
    }
    throw InvalidArgument(fmt::format(
        "{}: {} tensor{} not a parameter of the model: {}{}", file, extra.size(),
        extra.size() == 1 ? " is" : "s are", join(described, ", "),
        extra.size() > kMaxListed ? fmt::format(", ... ({} in all)", extra.size()) : ""));
  }
  for (const auto& p : space.params()) {
    const TensorEntry& e = *source.find(p.name);
    if (e.shape != p.shape) {
      throw InvalidArgument(
          fmt::format("{}: parameter '{}' has shape {} in the file, {} in the model", file, p.name,
                      shape_string(e.shape), shape_string(p.shape)));
    }
    if (!at::isFloatingType(e.dtype)) {
      throw InvalidArgument(fmt::format("{}: parameter '{}' has non-floating dtype {}", file,
                                        p.name, c10::toString(e.dtype)));
    }
  }
}

}  // namespace

ParamVector parameters_from(const Checkpoint& ckpt, const ParamSpace& space,
                            const ParamVector& like, bool allow_extra,
                            const ModelStructure* structure) {
  const SharedTensorSource source = model_tensors(ckpt);
  const std::string file = origin_of(ckpt, ckpt.model_file, kModelFile);
  if (!like.empty() && like.size() != space.size()) {
    throw InvalidArgument(fmt::format("parameters_from({}): `like` has {} tensors, the model {}",
                                      file, like.size(), space.size()));
  }
  check_fit(*source, file, space, allow_extra, structure);
  ParamVector out;
  out.reserve(space.size());
  for (size_t i = 0; i < space.size(); ++i) {
    const TensorEntry& e = *source->find(space[i].name);
    const auto options =
        like.empty() ? at::TensorOptions().dtype(e.dtype)
                     : at::TensorOptions().dtype(like[i].scalar_type()).device(like[i].device());
    at::Tensor t = at::empty(e.shape, options);
    source->read_into(e.name, {}, t);
    out.push_back(std::move(t));
  }
  return out;
}

void fill_parameters(const Checkpoint& ckpt, const ParamSpace& space, const ParamVector& dest,
                     bool allow_extra, const ModelStructure* structure) {
  const SharedTensorSource source = model_tensors(ckpt);
  const std::string file = origin_of(ckpt, ckpt.model_file, kModelFile);
  if (dest.size() != space.size()) {
    throw InvalidArgument(fmt::format("fill_parameters({}): {} destination tensors, the model {}",
                                      file, dest.size(), space.size()));
  }
  check_fit(*source, file, space, allow_extra, structure);
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < space.size(); ++i) source->read_into(space[i].name, {}, dest[i].detach());
}

int64_t model_bytes(const Checkpoint& ckpt) {
  if (ckpt.model_source) return ckpt.model_source->total_bytes();
  int64_t total = 0;
  for (const auto& [name, t] : ckpt.model)
    total += t.numel() * static_cast<int64_t>(t.element_size());
  return total;
}

at::Tensor optimizer_state(const Checkpoint& ckpt, const std::string& param,
                           const std::string& key) {
  return optimizer_state(saved_optimizer(ckpt), param, key);
}

at::Tensor optimizer_state(const Checkpoint& ckpt, const ParamInfo& param, const std::string& key,
                           bool required) {
  return optimizer_state(saved_optimizer(ckpt), param, key, required);
}

// ---------------------------------------------------------------------------------------------
// Saving

void save_checkpoint(const std::string& dir, int64_t step, const ParamSpace& space,
                     const ParamVector& params, const NamedTensors& optimizer_state,
                     const std::string& meta_json) {
  CheckpointMeta meta;
  if (!meta_json.empty()) {
    const std::string folder = (fs::path(dir) / fmt::format("step_{}", step)).string();
    try {
      meta =
          parse_checkpoint_meta(meta_json, fmt::format("save_checkpoint({}): meta_json", folder));
    } catch (const FormatError& e) {
      throw InvalidArgument(e.what());
    }
  }
  save_checkpoint(dir, step, space, params, optimizer_state, meta);
}

void save_checkpoint(const std::string& dir, int64_t step, const ParamSpace& space,
                     const ParamVector& params, const NamedTensors& optimizer_state,
                     const CheckpointMeta& meta_in) {
  const std::string folder = (fs::path(dir) / fmt::format("step_{}", step)).string();
  if (step < 0)
    throw InvalidArgument(fmt::format("save_checkpoint({}): step {} is negative", dir, step));
  if (params.size() != space.size()) {
    throw InvalidArgument(
        fmt::format("save_checkpoint({}): {} tensors for a model of {} parameters", folder,
                    params.size(), space.size()));
  }
  NamedTensors model;
  for (size_t i = 0; i < space.size(); ++i) {
    if (!params[i].defined() || params[i].sizes().vec() != space[i].shape) {
      throw InvalidArgument(fmt::format(
          "save_checkpoint({}): parameter '{}' has shape {}, the model expects {}", folder,
          space[i].name, params[i].defined() ? shape_string(params[i].sizes().vec()) : "undefined",
          shape_string(space[i].shape)));
    }
    model.emplace_back(space[i].name, params[i].detach());
  }
  // Validate meta.json before anything touches the disk.
  if (meta_in.step && *meta_in.step != step) {
    throw InvalidArgument(
        fmt::format("save_checkpoint({}): meta_json has \"step\": {}", folder, *meta_in.step));
  }
  CheckpointMeta meta = meta_in;
  meta.step = step;
  std::string meta_text;
  try {
    meta_text = checkpoint_meta_json(meta);
  } catch (const FormatError& e) {
    throw InvalidArgument(fmt::format("save_checkpoint({}): {}", folder, e.what()));
  }

  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) throw FormatError(fmt::format("{}: cannot create directory: {}", folder, ec.message()));
  // Re-saving a step: drop the old model.safetensors first, so that until the new one is in
  // place the folder reads as incomplete rather than as old parameters with new state.
  const std::string model_path = file_in(folder, kModelFile);
  if (fs::exists(model_path)) {
    fs::remove(model_path, ec);
    if (ec)
      throw FormatError(fmt::format("{}: cannot remove old file: {}", model_path, ec.message()));
  }
  const std::string optimizer_path = file_in(folder, kOptimizerFile);
  if (!optimizer_state.empty()) {
    write_safetensors(optimizer_path, optimizer_state);
  } else if (fs::exists(optimizer_path)) {
    // A stale file from an earlier save into the same folder would pair old state with new
    // parameters.
    fs::remove(optimizer_path, ec);
    if (ec)
      throw FormatError(
          fmt::format("{}: cannot remove stale file: {}", optimizer_path, ec.message()));
  }
  write_text_atomically(file_in(folder, kMetaFile), meta_text + "\n");
  write_safetensors(model_path, model, {{"format", "pt"}});
}

}  // namespace curv
