// Hugging Face Trainer folders: checkpoint-<N>/ with model.safetensors or pytorch_model.bin (or a
// sharded save's index), optional optimizer.pt, config.json and trainer_state.json; a published
// series of such model folders named by their step; and the Trainer's own parameter-group rule
// for its optimizer.pt.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>

#include "curv/core/error.h"
#include "curv/io/safetensors.h"
#include "curv/io/tensor_source.h"
#include "io/builtin_layouts.h"
#include "io/param_order_rules.h"
#include "io/torch_checkpoint.h"

namespace curv {

namespace {

namespace fs = std::filesystem;
using Kind = PyValue::Kind;

// The model weights of a Hugging Face folder: one file, or the index of a sharded save.
std::string hf_model_file(const std::string& folder) {
  for (const char* name : {"model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                           "pytorch_model.bin.index.json"}) {
    const std::string path = folder + "/" + name;
    if (fs::is_regular_file(path)) return path;
  }
  return "";
}

// Keeps the tensors of `source` that are not saved buffers.
SharedTensorSource without_buffers(SharedTensorSource source) {
  std::vector<std::pair<std::string, std::string>> kept;
  for (const auto& e : source->entries()) {
    if (!torch_state::is_saved_buffer(e.name, e.shape.size())) kept.emplace_back(e.name, e.name);
  }
  return renamed_tensor_source(std::move(source), std::move(kept));
}

// The tensors of torch.save weights files, read whole (a pickle gives no tensor alone).
SharedTensorSource torch_weights(const std::vector<std::string>& files, const std::string& origin) {
  NamedTensors out;
  for (const auto& path : files) {
    const auto root = load_torch_file(path);
    if (!root->is(Kind::kDict)) {
      throw FormatError(
          fmt::format("{}: holds a {}, expected a state dict", path, root->type_name()));
    }
    for (auto& named : torch_state::state_dict(*root, path)) out.push_back(std::move(named));
  }
  return memory_tensor_source(std::move(out), origin);
}

// A safetensors or torch.save weights file, saved buffers dropped; safetensors tensors stay in
// the file until read.
SharedTensorSource read_weights(const std::string& path) {
  if (torch_state::has_suffix(path, ".safetensors")) {
    return without_buffers(safetensors_source({path}));
  }
  return without_buffers(torch_weights({path}, path));
}

// Every tensor of a sharded save: the shards named by the index's "weight_map", in order of
// first mention; each tensor must be in the shard the index names.
SharedTensorSource read_sharded_weights(const std::string& index_path) {
  std::ifstream in(index_path);
  const auto index = nlohmann::json::parse(in, nullptr, false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    throw FormatError(
        fmt::format("{}: expected a JSON object with a \"weight_map\" object", index_path));
  }
  std::vector<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos) {
      throw FormatError(
          fmt::format("{}: \"weight_map.{}\" must be a file name in the folder, "
                      "got {}",
                      index_path, name, shard.dump()));
    }
    if (std::find(shards.begin(), shards.end(), shard.get<std::string>()) == shards.end()) {
      shards.push_back(shard.get<std::string>());
    }
  }
  const std::string folder = fs::path(index_path).parent_path().string();
  std::vector<std::string> files;
  for (const auto& shard : shards) files.push_back(folder + "/" + shard);
  const bool safetensors = torch_state::has_suffix(index_path, ".safetensors.index.json");
  // Which shard holds each tensor: checked against the index, shard by shard.
  const auto& map = index["weight_map"];
  for (const auto& shard : shards) {
    const std::string path = folder + "/" + shard;
    std::vector<std::string> names;
    if (safetensors) {
      names = SafetensorsReader(path).names();
    } else {
      for (const auto& e : torch_weights({path}, path)->entries()) names.push_back(e.name);
    }
    for (const auto& name : names) {
      if (map.contains(name) && map[name] != shard) {
        throw FormatError(fmt::format("{}: tensor '{}' is in {}, but the index places it in {}",
                                      index_path, name, shard, map[name].dump()));
      }
    }
  }
  return without_buffers(safetensors ? safetensors_source(files, index_path)
                                     : torch_weights(files, index_path));
}

std::optional<int64_t> hf_step(const std::string& entry) {
  if (entry.rfind("checkpoint-", 0) != 0) return std::nullopt;
  return step_number(entry.substr(11));
}

class HuggingFaceLayout : public CheckpointLayoutReader {
 public:
  std::string name() const override { return CheckpointLayout::kHuggingFace.name(); }
  std::string brief() const override { return "checkpoint-<N>/"; }
  std::string expected() const override {
    return "checkpoint-<N>/ folders with model.safetensors or pytorch_model.bin";
  }
  bool holds(const std::string& path, const std::string& entry) const override {
    return hf_step(entry) && fs::is_directory(path) && !hf_model_file(path).empty();
  }
  int64_t step(const std::string&, const std::string& entry) const override {
    return *hf_step(entry);
  }
  bool looks_like_one_checkpoint(const std::string& dir) const override {
    return !hf_model_file(dir).empty();
  }

  Checkpoint open(const CheckpointInfo& info, CheckpointParts) const override {
    Checkpoint ckpt;
    ckpt.step = info.step;
    ckpt.path = info.path;
    torch_state::SavedCheckpoint parts;
    ckpt.model_file = hf_model_file(info.path);
    if (ckpt.model_file.empty()) {
      throw FormatError(
          fmt::format("{}: no model.safetensors or pytorch_model.bin (nor a sharded "
                      "index of either)",
                      info.path));
    }
    ckpt.model_source = torch_state::has_suffix(ckpt.model_file, ".index.json")
                            ? read_sharded_weights(ckpt.model_file)
                            : read_weights(ckpt.model_file);
    ckpt.optimizer_file = info.path + "/optimizer.pt";
    if (fs::is_regular_file(ckpt.optimizer_file)) {
      const auto root = load_torch_file(ckpt.optimizer_file);
      if (!root->is(Kind::kDict)) {
        throw FormatError(fmt::format("{}: holds a {}, expected optimizer.state_dict()",
                                      ckpt.optimizer_file, root->type_name()));
      }
      parts.optimizer = torch_state::optimizer_state_dict(*root, ckpt.optimizer_file, parts.meta);
      parts.optimizer->writer_rule = IndexedOptimizerState::WriterRule{ParamOrder::kTrainer, false,
                                                                       "the Hugging Face Trainer"};
    }
    // The optimizer's hyper-parameters and step count come from optimizer.pt.
    ckpt.meta_file = parts.optimizer ? ckpt.optimizer_file : info.path;
    // The model's config.json, read by the architecture of its model_type (ModelConfig).
    const std::string config = info.path + "/config.json";
    if (fs::is_regular_file(config)) {
      std::ifstream in(config);
      const auto j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        throw FormatError(fmt::format("{}: not a JSON object", config));
      }
      parts.meta["model"] = j;
      ckpt.model_config_file = config;
    }
    const std::string trainer_state = info.path + "/trainer_state.json";
    if (fs::is_regular_file(trainer_state)) {
      std::ifstream in(trainer_state);
      const auto state = nlohmann::json::parse(in, nullptr, false);
      if (state.is_discarded() || !state.is_object()) {
        throw FormatError(fmt::format("{}: not a JSON object", trainer_state));
      }
      if (state.contains("global_step") && state["global_step"] != info.step) {
        throw FormatError(fmt::format("{}: \"global_step\" is {} but the folder is step {}",
                                      trainer_state, state["global_step"].dump(), info.step));
      }
    }
    parts.meta["step"] = info.step;
    ckpt.indexed_optimizer = parts.optimizer;
    ckpt.meta = parse_checkpoint_meta(parts.meta.dump(), ckpt.meta_file);
    return ckpt;
  }
};

// A published series of revisions: Hugging Face model folders whose names hold the step as one
// "step<N>" token between hyphens (Pythia's step1000/, OLMo's stage1-step1000-tokens5B/).
std::optional<int64_t> revision_step(const std::string& entry) {
  static const std::regex token(R"((?:^|-)step([0-9]+)(?=-|$))");
  std::optional<int64_t> step;
  for (std::sregex_iterator it(entry.begin(), entry.end(), token), end; it != end; ++it) {
    if (step) return std::nullopt;  // two step tokens: not a revision's name
    step = step_number((*it)[1].str());
  }
  return step;
}

class HuggingFaceRevisionsLayout : public HuggingFaceLayout {
 public:
  std::string name() const override { return "hf_revisions"; }
  std::string brief() const override { return "step<N>/ revision folders"; }
  std::string expected() const override {
    return "Hugging Face model folders named by their step (step1000/, "
           "stage1-step1000-tokens5B/)";
  }
  bool holds(const std::string& path, const std::string& entry) const override {
    return revision_step(entry) && fs::is_directory(path) && !hf_model_file(path).empty();
  }
  int64_t step(const std::string&, const std::string& entry) const override {
    return *revision_step(entry);
  }
  bool looks_like_one_checkpoint(const std::string&) const override { return false; }
};

}  // namespace

std::shared_ptr<const CheckpointLayoutReader> hf_layout() {
  return std::make_shared<HuggingFaceLayout>();
}

std::shared_ptr<const CheckpointLayoutReader> hf_revisions_layout() {
  return std::make_shared<HuggingFaceRevisionsLayout>();
}

// The Hugging Face Trainer's create_optimizer: group 0 holds get_decay_parameter_names(model) in
// model order, group 1 the rest. A parameter is undecayed when it lies in an nn.LayerNorm (here:
// a parameter whose role is a norm gain or bias) or its lower-cased name matches bias, layernorm,
// rmsnorm, (^|.)norm($|.) or _norm($|.).
ParamMapping by_trainer_groups(const OrderInput& in) {
  static const std::regex undecayed_name(R"(bias|layernorm|rmsnorm|(^|\.)norm($|\.)|_norm($|\.))");
  auto decayed = [&](size_t i) {
    if (in.structure && i < in.structure->params.size()) {
      const ParamRole role = in.structure->params[i].role;
      if (role == ParamRole::kNormGain || role == ParamRole::kNormBias) return false;
    }
    std::string name = in.space[i].name;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return !std::regex_search(name, undecayed_name);
  };
  return two_groups(in, ParamOrder::kTrainer, decayed, [](size_t decayed_count, size_t rest) {
    return fmt::format("the Trainer's rule gives {} weight-decayed and {} others", decayed_count,
                       rest);
  });
}

}  // namespace curv
