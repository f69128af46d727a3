#include "curv/io/checkpoint.h"

#include <ATen/ATen.h>
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
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/io/safetensors.h"
#include "io/torch_layouts.h"

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

// Non-negative decimal integer, all of `text`; nullopt otherwise (or on overflow).
std::optional<int64_t> parse_step_number(const std::string& text) {
  if (text.empty() || text.size() > 18) return std::nullopt;  // 18 digits cannot overflow
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

std::vector<std::string> first_few(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (size_t i = 0; i < std::min(items.size(), kMaxListed); ++i)
    out.push_back("'" + items[i] + "'");
  if (items.size() > kMaxListed) out.push_back(fmt::format("... ({} in all)", items.size()));
  return out;
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

nlohmann::json parse_json_object(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("{}: not valid JSON: {}", origin, e.what()));
  }
  if (!j.is_object()) {
    throw FormatError(fmt::format("{}: expected a JSON object, got {}", origin, j.type_name()));
  }
  return j;
}

// FormatError naming the file, the key's path in meta.json and the value unless `ok`.
void expect(bool ok, const std::string& origin, const std::string& field, const char* wanted,
            const nlohmann::json& value) {
  if (!ok) {
    throw FormatError(
        fmt::format("{}: \"{}\" must be {}, got {}", origin, field, wanted, value.dump()));
  }
}

OptimizerParamGroup parse_param_group(const nlohmann::json& group, size_t k,
                                      const std::string& origin) {
  const std::string field = fmt::format("optimizer.param_groups[{}]", k);
  const bool shaped = group.is_object() && group.contains("params") && group["params"].is_array() &&
                      group.contains("hyper") && group["hyper"].is_object();
  if (!shaped) {
    throw FormatError(
        fmt::format("{}: \"{}\" must be an object with \"params\" (names) and "
                    "\"hyper\"",
                    origin, field));
  }
  OptimizerParamGroup out;
  for (const auto& name : group["params"]) {
    expect(name.is_string(), origin, field + ".params[]", "a parameter name", name);
    out.params.push_back(name.get<std::string>());
  }
  for (const auto& [key, value] : group["hyper"].items()) {
    if (!value.is_number()) {
      throw FormatError(
          fmt::format("{}: parameter group hyper-parameter \"{}\" must be a "
                      "number, got {}",
                      origin, key, value.dump()));
    }
    out.hyper.emplace_back(key, value.get<double>());
  }
  return out;
}

OptimizerRecord parse_optimizer_record(const nlohmann::json& opt, const std::string& origin) {
  expect(opt.is_object(), origin, "optimizer", "an object", opt);
  OptimizerRecord r;
  if (opt.contains("name")) {
    expect(opt["name"].is_string(), origin, "optimizer.name", "a string", opt["name"]);
    r.name = opt["name"].get<std::string>();
  }
  if (opt.contains("hyper")) {
    const auto& hyper = opt["hyper"];
    expect(hyper.is_object(), origin, "optimizer.hyper", "an object", hyper);
    for (const auto& [key, value] : hyper.items()) {
      if (value.is_number()) {
        r.hyper.emplace_back(key, value.get<double>());
      } else {
        r.non_numeric_hyper.emplace_back(key, value.dump());
      }
    }
  }
  if (opt.contains("step_count")) {
    expect(opt["step_count"].is_number_integer(), origin, "optimizer.step_count", "an integer",
           opt["step_count"]);
    r.step_count = opt["step_count"].get<int64_t>();
  }
  if (opt.contains("muon_params")) {
    expect(opt["muon_params"].is_string(), origin, "optimizer.muon_params", "a string",
           opt["muon_params"]);
    r.muon_params = opt["muon_params"].get<std::string>();
  }
  if (opt.contains("param_order")) {
    expect(opt["param_order"].is_string(), origin, "optimizer.param_order", "a string",
           opt["param_order"]);
    r.param_order = opt["param_order"].get<std::string>();
  }
  if (opt.contains("partition")) {
    const auto& partition = opt["partition"];
    expect(partition.is_object(), origin, "optimizer.partition", "an object", partition);
    for (const auto& [param, rule] : partition.items()) {
      expect(rule.is_string(), origin, "optimizer.partition." + param, "a string", rule);
      r.partition.emplace_back(param, rule.get<std::string>());
    }
  }
  if (opt.contains("param_groups")) {
    const auto& groups = opt["param_groups"];
    expect(groups.is_array(), origin, "optimizer.param_groups", "an array", groups);
    for (size_t k = 0; k < groups.size(); ++k) {
      r.param_groups.push_back(parse_param_group(groups[k], k, origin));
    }
  }
  return r;
}

// `value` unless `raw` already holds the same number: re-saving keeps 5 as 5, not 5.0.
nlohmann::json number_over(const nlohmann::json* raw, double value) {
  if (raw && raw->is_number() && raw->get<double>() == value) return *raw;
  return value;
}

nlohmann::json hyper_json(const std::vector<std::pair<std::string, double>>& hyper,
                          const nlohmann::json* raw) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : hyper) {
    const bool known = raw && raw->is_object() && raw->contains(key);
    out[key] = number_over(known ? &(*raw)[key] : nullptr, value);
  }
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) throw FormatError(fmt::format("{}: cannot read", path));
  return out.str();
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
    auto value = parse_step_number(text);
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

// ---------------------------------------------------------------------------------------------
// Listing and loading

std::vector<CheckpointInfo> list_checkpoints(const std::string& dir, const StepSelection& selection,
                                             CheckpointLayout layout) {
  if (layout == CheckpointLayout::kAuto) layout = detect_checkpoint_layout(dir);
  if (layout != CheckpointLayout::kNative) {
    return select_some(list_torch_checkpoints(dir, layout), selection, dir);
  }
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  if (!fs::exists(status)) {
    throw FormatError(fmt::format("checkpoint directory {} does not exist", dir));
  }
  if (!fs::is_directory(status)) {
    throw FormatError(fmt::format("checkpoint directory {} is not a directory", dir));
  }
  std::vector<CheckpointInfo> found;
  std::map<int64_t, std::string> by_step;  // to catch step_7 next to step_07
  try {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("step_", 0) != 0) continue;
      const auto step = parse_step_number(name.substr(5));
      if (!step) continue;
      const std::string folder = (fs::path(dir) / name).string();
      if (!fs::is_directory(entry.status()) || !fs::is_regular_file(file_in(folder, kModelFile)))
        continue;
      auto [it, inserted] = by_step.emplace(*step, name);
      if (!inserted) {
        throw FormatError(fmt::format("checkpoint directory {}: folders {} and {} are both step {}",
                                      dir, it->second, name, *step));
      }
      found.push_back({*step, folder});
    }
  } catch (const fs::filesystem_error& e) {
    throw FormatError(fmt::format("checkpoint directory {}: cannot list: {}", dir, e.what()));
  }
  if (found.empty()) {
    // A common slip is to pass one checkpoint's folder instead of the run's directory.
    const bool is_step_folder = fs::is_regular_file(file_in(dir, kModelFile));
    throw FormatError(fmt::format(
        "no checkpoints in {}: expected folders step_<N>/{}{}", dir, kModelFile,
        is_step_folder ? " (this looks like a single checkpoint folder: pass its parent)" : ""));
  }
  std::sort(found.begin(), found.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  return select_some(found, selection, dir);
}

// ---------------------------------------------------------------------------------------------
// meta.json

CheckpointMeta parse_checkpoint_meta(const std::string& text, const std::string& origin) {
  const nlohmann::json j = parse_json_object(text, origin);
  CheckpointMeta meta;
  meta.json = text;
  if (j.contains("step")) {
    expect(j["step"].is_number_integer(), origin, "step", "an integer", j["step"]);
    meta.step = j["step"].get<int64_t>();
  }
  if (j.contains("model")) {
    expect(j["model"].is_object(), origin, "model", "an object", j["model"]);
    meta.model_json = j["model"].dump();
  }
  if (j.contains("optimizer")) meta.optimizer = parse_optimizer_record(j["optimizer"], origin);
  return meta;
}

std::string checkpoint_meta_json(const CheckpointMeta& meta) {
  nlohmann::json j =
      parse_json_object(meta.json.empty() ? "{}" : meta.json, "CheckpointMeta::json");
  if (meta.step) j["step"] = *meta.step;
  if (!meta.model_json.empty())
    j["model"] = parse_json_object(meta.model_json, "CheckpointMeta::model_json");
  if (meta.optimizer) {
    const OptimizerRecord& r = *meta.optimizer;
    nlohmann::json& opt = j["optimizer"];
    if (!opt.is_object()) opt = nlohmann::json::object();
    if (!r.name.empty()) opt["name"] = r.name;
    if (!r.hyper.empty() || !r.non_numeric_hyper.empty() || opt.contains("hyper")) {
      const nlohmann::json* raw = opt.contains("hyper") ? &opt["hyper"] : nullptr;
      nlohmann::json hyper = hyper_json(r.hyper, raw);
      for (const auto& [key, text] : r.non_numeric_hyper) hyper[key] = nlohmann::json::parse(text);
      opt["hyper"] = hyper;
    }
    if (r.step_count) opt["step_count"] = *r.step_count;
    if (r.muon_params) opt["muon_params"] = *r.muon_params;
    if (!r.param_order.empty()) opt["param_order"] = r.param_order;
    if (!r.partition.empty()) {
      nlohmann::json partition = nlohmann::json::object();
      for (const auto& [param, rule] : r.partition) partition[param] = rule;
      opt["partition"] = partition;
    }
    if (!r.param_groups.empty()) {
      const nlohmann::json* raw = opt.contains("param_groups") && opt["param_groups"].is_array()
                                      ? &opt["param_groups"]
                                      : nullptr;
      nlohmann::json groups = nlohmann::json::array();
      for (size_t k = 0; k < r.param_groups.size(); ++k) {
        const auto& g = r.param_groups[k];
        const nlohmann::json* raw_hyper =
            raw && k < raw->size() && (*raw)[k].contains("hyper") ? &(*raw)[k]["hyper"] : nullptr;
        groups.push_back({{"params", g.params}, {"hyper", hyper_json(g.hyper, raw_hyper)}});
      }
      opt["param_groups"] = groups;
    }
  }
  return j.dump(2);
}

SavedOptimizer saved_optimizer(const Checkpoint& ckpt) {
  SavedOptimizer saved;
  saved.checkpoint = ckpt.path;
  saved.step = ckpt.step;
  saved.tensors = ckpt.optimizer;
  saved.file = origin_of(ckpt, ckpt.optimizer_file, kOptimizerFile);
  saved.meta_file = origin_of(ckpt, ckpt.meta_file, kMetaFile);
  if (ckpt.meta.optimizer) saved.record = *ckpt.meta.optimizer;
  saved.unresolved = ckpt.indexed_optimizer != nullptr;
  return saved;
}

std::string checkpoint_digest(const CheckpointInfo& info) {
  std::vector<fs::path> files;
  if (fs::is_directory(info.path)) {
    for (const auto& entry : fs::directory_iterator(info.path)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(info.path);
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t total = 0;
  std::vector<char> buffer(1 << 20);
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw FormatError(fmt::format("cannot read '{}'", file.string()));
    while (in) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const auto n = static_cast<uInt>(in.gcount());
      crc = crc32(crc, reinterpret_cast<const Bytef*>(buffer.data()), n);
      total += n;
    }
    if (in.bad()) throw FormatError(fmt::format("cannot read '{}'", file.string()));
  }
  return fmt::format("crc32:{:08x} bytes:{}", static_cast<uint32_t>(crc), total);
}

Checkpoint load_checkpoint(const CheckpointInfo& info, CheckpointParts parts) {
  // The PyTorch layouts build their meta from the file's records and parse it there, once.
  if (info.layout != CheckpointLayout::kNative) {
    Checkpoint ckpt = load_torch_checkpoint(info);
    if (parts == CheckpointParts::kModelOnly) {
      ckpt.optimizer.clear();
      ckpt.indexed_optimizer.reset();
    }
    return ckpt;
  }
  Checkpoint ckpt;
  ckpt.step = info.step;
  ckpt.path = info.path;
  ckpt.model_file = file_in(info.path, kModelFile);
  ckpt.optimizer_file = file_in(info.path, kOptimizerFile);
  ckpt.meta_file = file_in(info.path, kMetaFile);
  ckpt.model = SafetensorsReader(ckpt.model_file).tensors();
  const std::string optimizer_path = ckpt.optimizer_file;
  if (parts == CheckpointParts::kAll && fs::exists(optimizer_path)) {
    ckpt.optimizer = SafetensorsReader(optimizer_path).tensors();
  }
  const std::string meta_path = ckpt.meta_file;
  if (fs::exists(meta_path)) {
    ckpt.meta = parse_checkpoint_meta(read_text(meta_path), meta_path);
    if (!ckpt.meta.model_json.empty()) ckpt.model_config_file = meta_path;
    if (ckpt.meta.step && *ckpt.meta.step != info.step) {
      throw FormatError(fmt::format("{}: \"step\" is {} but the folder is step {}", meta_path,
                                    *ckpt.meta.step, info.step));
    }
  }
  return ckpt;
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

ParamVector parameters_from(const Checkpoint& ckpt, const ParamSpace& space,
                            const ParamVector& like, bool allow_extra) {
  const std::string file = origin_of(ckpt, ckpt.model_file, kModelFile);
  if (!like.empty() && like.size() != space.size()) {
    throw InvalidArgument(fmt::format("parameters_from({}): `like` has {} tensors, the model {}",
                                      file, like.size(), space.size()));
  }
  std::unordered_map<std::string, size_t> in_file;
  std::vector<std::string> file_names;
  for (size_t i = 0; i < ckpt.model.size(); ++i) {
    in_file.emplace(ckpt.model[i].first, i);
    file_names.push_back(ckpt.model[i].first);
  }

  std::vector<std::string> missing;
  for (const auto& p : space.params()) {
    if (!in_file.count(p.name)) missing.push_back(p.name);
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
  // the same tensor, different values mean the checkpoint was trained with an untied head.
  std::vector<std::string> extra;
  for (const auto& name : file_names) {
    if (space.find(name)) continue;
    if (name == "lm_head.weight" && space.find("transformer.wte.weight")) {
      const auto& head = ckpt.model[in_file.at(name)].second;
      const auto& wte = ckpt.model[in_file.at("transformer.wte.weight")].second;
      if (at::equal(head, wte)) continue;
      if (!allow_extra) {
        throw InvalidArgument(fmt::format(
            "{}: 'lm_head.weight' differs from 'transformer.wte.weight', so the checkpoint has an "
            "untied head but the model is tied (set \"tied\": false in the model config)",
            file));
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

  ParamVector out;
  out.reserve(space.size());
  for (size_t i = 0; i < space.size(); ++i) {
    const auto& p = space[i];
    const auto& t = ckpt.model[in_file.at(p.name)].second;
    if (t.sizes().vec() != p.shape) {
      throw InvalidArgument(
          fmt::format("{}: parameter '{}' has shape {} in the file, {} in the model", file, p.name,
                      shape_string(t.sizes().vec()), shape_string(p.shape)));
    }
    if (!at::isFloatingType(t.scalar_type())) {
      throw InvalidArgument(fmt::format("{}: parameter '{}' has non-floating dtype {}", file,
                                        p.name, c10::toString(t.scalar_type())));
    }
    out.push_back(like.empty() ? t : t.to(like[i].device(), like[i].scalar_type()));
  }
  return out;
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
