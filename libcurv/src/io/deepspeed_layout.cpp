// DeepSpeed's ZeRO checkpoints: global_step<N>/ with mp_rank_00_model_states.pt (ZeRO 1 and 2;
// the module's weights in the training dtype and `param_shapes`) or one
// zero_pp_rank_<R>_mp_rank_00_model_states.pt per rank (ZeRO 3), and per rank
// [bf16_|fp16_]zero_pp_rank_<R>_mp_rank_00_optim_states.pt: that rank's partition of the fp32
// master weights and of the optimizer state, flattened per parameter group. The partitions are
// joined and cut by `param_shapes` as DeepSpeed's zero_to_fp32.py does; the audited parameters
// are the fp32 master weights when the files hold them.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include "curv/core/error.h"
#include "io/builtin_layouts.h"
#include "io/torch_checkpoint.h"
#include "io/torch_pickle.h"

namespace curv {

namespace {

namespace fs = std::filesystem;
using Kind = PyValue::Kind;
using Ref = PyValue::Ref;

Ref load_ds(const std::string& path) {
  TorchFileOptions options;
  options.deepspeed_classes = true;
  return load_torch_file(path, options);
}

const PyValue& key(const PyValue& dict, const std::string& name, const std::string& origin,
                   Kind kind) {
  return torch_state::require(dict.find(name), origin, name, kind);
}

// The files of one global_step<N>/ folder.
struct ZeroFiles {
  std::string model;               // mp_rank_00_model_states.pt, or rank 0's under ZeRO 3
  std::vector<std::string> optim;  // by rank
};

ZeroFiles zero_files(const std::string& folder) {
  static const std::regex optim(R"((bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt)");
  ZeroFiles files;
  std::map<int64_t, std::string> by_rank;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, optim)) by_rank[std::stoll(m[2].str())] = entry.path().string();
  }
  for (const char* name :
       {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"}) {
    if (fs::is_regular_file(fs::path(folder) / name)) {
      files.model = (fs::path(folder) / name).string();
      break;
    }
  }
  int64_t expected = 0;
  for (const auto& [rank, path] : by_rank) {
    if (rank != expected++) {
      throw FormatError(
          fmt::format("{}: the optimizer states of ranks 0 to {} are not all there "
                      "(rank {} is missing)",
                      folder, by_rank.rbegin()->first, expected - 1));
    }
    files.optim.push_back(path);
  }
  return files;
}

// One parameter group's flat partitions joined across ranks, cut into parameters.
struct GroupLayout {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
};

std::vector<GroupLayout> param_shapes(const PyValue& model_states, const std::string& origin) {
  const PyValue& groups = key(model_states, "param_shapes", origin, Kind::kList);
  std::vector<GroupLayout> out;
  for (const auto& g : groups.items) {
    if (!g->is(Kind::kDict)) {
      throw FormatError(
          fmt::format("{}: 'param_shapes' holds {}, expected dicts", origin, g->brief()));
    }
    GroupLayout layout;
    for (const auto& [name, shape] : g->entries) {
      std::vector<int64_t> dims;
      for (const auto& d : shape->items) {
        if (!d->is(Kind::kInt)) {
          throw FormatError(fmt::format("{}: 'param_shapes' gives '{}' the shape {}", origin,
                                        name->text, shape->brief()));
        }
        dims.push_back(d->integer);
      }
      layout.names.push_back(name->text);
      layout.shapes.push_back(dims);
    }
    out.push_back(layout);
  }
  return out;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Cuts flat partitions, `flats[rank][group]`, into every group's parameters, as DeepSpeed's
// zero_to_fp32.py does. ZeRO 1/2: a group's partitions joined over the ranks are its flat vector,
// its parameters in order (with the per-parameter alignment paddings, when recorded). ZeRO 3:
// a rank's groups joined hold a part of every parameter in order, ceil(numel / ranks) elements
// each.
std::vector<std::vector<at::Tensor>> unflatten(const std::vector<std::vector<at::Tensor>>& flats,
                                               const std::vector<GroupLayout>& groups,
                                               int64_t stage,
                                               const std::vector<std::vector<int64_t>>& paddings,
                                               const std::string& origin) {
  std::vector<std::vector<at::Tensor>> out(groups.size());
  const auto ranks = static_cast<int64_t>(flats.size());
  auto beyond = [&](const std::string& name, int64_t have) {
    return FormatError(
        fmt::format("{}: '{}' lies beyond the {} elements of its partitions (the "
                    "ranks' files are of different saves?)",
                    origin, name, have));
  };
  if (stage <= 2) {
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<at::Tensor> parts;
      for (const auto& rank : flats) parts.push_back(rank[g]);
      const at::Tensor flat = at::cat(parts);
      int64_t offset = 0;
      for (size_t i = 0; i < groups[g].names.size(); ++i) {
        const int64_t n = numel_of(groups[g].shapes[i]);
        if (offset + n > flat.numel()) throw beyond(groups[g].names[i], flat.numel());
        out[g].push_back(flat.narrow(0, offset, n).view(groups[g].shapes[i]));
        offset += n + (g < paddings.size() && i < paddings[g].size() ? paddings[g][i] : 0);
      }
    }
    return out;
  }
  std::vector<at::Tensor> per_rank;
  for (const auto& rank : flats) per_rank.push_back(at::cat(rank));
  int64_t offset = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].names.size(); ++i) {
      const int64_t n = numel_of(groups[g].shapes[i]);
      const int64_t part = (n + ranks - 1) / ranks;
      std::vector<at::Tensor> pieces;
      for (const auto& f : per_rank) {
        if (offset + part > f.numel()) throw beyond(groups[g].names[i], f.numel());
        pieces.push_back(f.narrow(0, offset, part));
      }
      out[g].push_back(at::cat(pieces).narrow(0, 0, n).view(groups[g].shapes[i]));
      offset += part;
    }
  }
  return out;
}

std::vector<int64_t> int_list(const PyValue* v) {
  std::vector<int64_t> out;
  if (v == nullptr) return out;
  for (const auto& item : v->items) out.push_back(item->is(Kind::kInt) ? item->integer : 0);
  return out;
}

// The state of group `g` in a rank's optimizer state dict, or nullptr.
const PyValue* group_state(const PyValue& base, size_t g, const std::string& file) {
  for (const auto& [k, v] : key(base, "state", file, Kind::kDict).entries) {
    if (k->is(Kind::kInt) && k->integer == static_cast<int64_t>(g)) return v.get();
  }
  return nullptr;
}

// The ranks' optimizer files: fp32 master weights by name, and torch's optimizer.state_dict()
// form of the optimizer state with the names recorded.
struct ZeroState {
  NamedTensors master;
  Ref optimizer;
  int64_t stage = 0;
};

// `flats[rank][group]`: each rank's tensor under `pick(rank dict, file, group)`.
using Pick = std::function<const PyValue*(const PyValue&, const std::string&, size_t)>;
std::vector<std::vector<at::Tensor>> gather(const std::vector<Ref>& ranks,
                                            const std::vector<std::string>& files, size_t groups,
                                            const Pick& pick) {
  std::vector<std::vector<at::Tensor>> flats(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (size_t g = 0; g < groups; ++g) {
      const PyValue* v = pick(*ranks[r], files[r], g);
      if (v == nullptr || !v->is(Kind::kTensor)) {
        throw FormatError(fmt::format("{}: group {} holds {}, expected a flat tensor", files[r], g,
                                      v ? v->brief() : "nothing"));
      }
      flats[r].push_back(v->tensor.reshape({-1}));
    }
  }
  return flats;
}

ZeroState read_zero_state(const ZeroFiles& files, const std::vector<GroupLayout>& groups) {
  std::vector<Ref> ranks;
  for (const auto& path : files.optim) {
    const Ref root = load_ds(path);
    ranks.push_back(
        std::make_shared<PyValue>(key(*root, "optimizer_state_dict", path, Kind::kDict)));
  }
  const std::string origin = files.optim.front();
  const PyValue& first = *ranks.front();
  const PyValue& stage_value = key(first, "zero_stage", origin, Kind::kObject);
  ZeroState out;
  if (!stage_value.items.empty() && stage_value.items[0]->is(Kind::kInt)) {
    out.stage = stage_value.items[0]->integer;
  }
  if (out.stage < 1 || out.stage > 3) {
    throw FormatError(
        fmt::format("{}: 'zero_stage' is {}, expected 1, 2 or 3", origin, stage_value.brief()));
  }
  const std::string flat_key =
      out.stage <= 2 ? "single_partition_of_fp32_groups" : "fp32_flat_groups";
  const std::string base_key = out.stage <= 2 ? "base_optimizer_state" : "optimizer_state_dict";
  const PyValue& base = key(first, base_key, origin, Kind::kDict);
  const PyValue& torch_groups = key(base, "param_groups", origin, Kind::kList);
  if (torch_groups.items.size() != groups.size()) {
    throw FormatError(fmt::format("{}: {} parameter groups, but param_shapes lists {}", origin,
                                  torch_groups.items.size(), groups.size()));
  }
  std::vector<std::vector<int64_t>> paddings;
  if (const PyValue* p = first.find("param_alignment_paddings")) {
    for (const auto& g : p->items) paddings.push_back(int_list(g.get()));
  }
  const auto master = unflatten(
      gather(ranks, files.optim, groups.size(),
             [&](const PyValue& rank, const std::string& file, size_t g) -> const PyValue* {
               const PyValue& list = key(rank, flat_key, file, Kind::kList);
               return g < list.items.size() ? list.items[g].get() : nullptr;
             }),
      groups, out.stage, paddings, origin);
  // The optimizer state: flat tensors cut like the weights, scalars (step) shared by the group.
  std::vector<std::map<std::string, std::vector<at::Tensor>>> state(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const PyValue* s = group_state(base, g, origin);
    if (s == nullptr) continue;
    for (const auto& [name, value] : s->entries) {
      if (value->is(Kind::kTensor) && value->tensor.dim() == 0) {
        state[g][name->text] = std::vector<at::Tensor>(master[g].size(), value->tensor);
      }
    }
  }
  std::set<std::string> flat_fields;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (const PyValue* s = group_state(base, g, origin)) {
      for (const auto& [name, value] : s->entries) {
        if (value->is(Kind::kTensor) && value->tensor.dim() > 0) flat_fields.insert(name->text);
      }
    }
  }
  for (const auto& field : flat_fields) {
    const auto cut = unflatten(
        gather(ranks, files.optim, groups.size(),
               [&](const PyValue& rank, const std::string& file, size_t g) -> const PyValue* {
                 const PyValue* s = group_state(key(rank, base_key, file, Kind::kDict), g, file);
                 return s ? s->find(field) : nullptr;
               }),
        groups, out.stage, paddings, origin);
    for (size_t g = 0; g < groups.size(); ++g) state[g][field] = cut[g];
  }
  auto state_dict = make_value(Kind::kDict);
  auto groups_list = make_value(Kind::kList);
  int64_t index = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    auto params = make_value(Kind::kList);
    auto names = make_value(Kind::kList);
    for (size_t i = 0; i < master[g].size(); ++i) {
      out.master.emplace_back(groups[g].names[i], master[g][i]);
      auto slot = make_value(Kind::kDict);
      for (const auto& [field, tensors] : state[g]) {
        slot->entries.emplace_back(string_value(field), tensor_value(tensors[i]));
      }
      if (!slot->entries.empty()) state_dict->entries.emplace_back(int_value(index), slot);
      params->items.push_back(int_value(index++));
      names->items.push_back(string_value(groups[g].names[i]));
    }
    auto group = make_value(Kind::kDict);
    for (const auto& [k, v] : torch_groups.items[g]->entries) {
      if (k->is(Kind::kString) && k->text != "params") group->entries.emplace_back(k, v);
    }
    group->entries.emplace_back(string_value("params"), params);
    group->entries.emplace_back(string_value("param_names"), names);
    groups_list->items.push_back(group);
  }
  out.optimizer = make_value(Kind::kDict);
  out.optimizer->entries.emplace_back(string_value("state"), state_dict);
  out.optimizer->entries.emplace_back(string_value("param_groups"), groups_list);
  return out;
}

std::optional<int64_t> ds_step(const std::string& entry) {
  if (entry.rfind("global_step", 0) != 0) return std::nullopt;
  return step_number(entry.substr(11));
}

class DeepSpeedLayout : public CheckpointLayoutReader {
 public:
  std::string name() const override { return "deepspeed"; }
  std::string brief() const override { return "global_step<N>/mp_rank_00_model_states.pt"; }
  std::string expected() const override {
    return "global_step<N>/ folders with DeepSpeed's mp_rank_00_model_states.pt or "
           "zero_pp_rank_0_mp_rank_00_model_states.pt";
  }
  bool holds(const std::string& path, const std::string& entry) const override {
    return ds_step(entry) &&
           (fs::is_regular_file(path + "/mp_rank_00_model_states.pt") ||
            fs::is_regular_file(path + "/zero_pp_rank_0_mp_rank_00_model_states.pt"));
  }
  int64_t step(const std::string&, const std::string& entry) const override {
    return *ds_step(entry);
  }
  bool looks_like_one_checkpoint(const std::string& dir) const override {
    return fs::is_regular_file(dir + "/mp_rank_00_model_states.pt");
  }

  Checkpoint load(const CheckpointInfo& info, CheckpointParts) const override {
    const ZeroFiles files = zero_files(info.path);
    const Ref model_states = load_ds(files.model);
    const PyValue& steps = key(*model_states, "global_steps", files.model, Kind::kInt);
    if (steps.integer != info.step) {
      throw FormatError(fmt::format("{}: 'global_steps' is {} but the folder is step {}",
                                    files.model, steps.integer, info.step));
    }
    const auto groups = param_shapes(*model_states, files.model);
    Checkpoint ckpt;
    ckpt.step = info.step;
    ckpt.path = info.path;
    nlohmann::json meta = nlohmann::json::object();
    meta["step"] = info.step;
    if (!files.optim.empty()) {
      ZeroState zero = read_zero_state(files, groups);
      ckpt.model = std::move(zero.master);
      ckpt.model_file = fmt::format(
          "{}/*zero_pp_rank_*_optim_states.pt (fp32 master weights, "
          "ZeRO stage {}, {} ranks)",
          info.path, zero.stage, files.optim.size());
      ckpt.optimizer_file = files.optim.front();
      ckpt.indexed_optimizer =
          torch_state::optimizer_state_dict(*zero.optimizer, ckpt.optimizer_file, meta);
      meta["weights"] = "fp32 master weights";
    } else {
      const PyValue& module = key(*model_states, "module", files.model, Kind::kDict);
      ckpt.model = torch_state::state_dict(module, files.model + " ['module']");
      ckpt.model_file = files.model + " ['module']";
      meta["weights"] = "module";
    }
    ckpt.meta_file = files.model;
    for (const auto& dir : {fs::path(info.path), fs::path(info.path).parent_path()}) {
      const std::string config = (dir / "config.json").string();
      if (!fs::is_regular_file(config)) continue;
      std::ifstream in(config);
      const auto j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_discarded() || !j.is_object())
        throw FormatError(fmt::format("{}: not a JSON object", config));
      meta["model"] = j;
      ckpt.model_config_file = config;
      break;
    }
    ckpt.meta = parse_checkpoint_meta(meta.dump(), ckpt.meta_file);
    return ckpt;
  }
};

}  // namespace

std::shared_ptr<const CheckpointLayoutReader> deepspeed_layout() {
  return std::make_shared<DeepSpeedLayout>();
}

}  // namespace curv
