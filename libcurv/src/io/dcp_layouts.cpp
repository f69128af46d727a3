// Runs saved by torch.distributed.checkpoint: torchtitan's step-<N>/ folders (and any step-<N>/
// DCP save of a model and optimizer), and Accelerate's / the Hugging Face Trainer's FSDP folders
// checkpoint-<N>/pytorch_model_fsdp_0 and optimizer_0. The model is a tensor source over the
// shards; the optimizer's flattened or nested state becomes torch's optimizer.state_dict() form,
// recognised and named by parameter as any torch optimizer state is.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/io/dcp.h"
#include "io/builtin_layouts.h"
#include "io/torch_checkpoint.h"
#include "io/torch_pickle.h"

namespace curv {

namespace {

namespace fs = std::filesystem;
using Kind = PyValue::Kind;
using Ref = PyValue::Ref;

constexpr const char* kOptimizerState = "optimizer.state.";
constexpr const char* kOptimizerGroups = "optimizer.param_groups.";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// How a save's keys become the model's parameter names, and which rows a name's tensors hold in
// another order.
struct KeyMap {
  // Source key → model name ("" drops the key).
  std::map<std::string, std::string> model;
  // Model name → heads, for torchtitan's wq / wk (see interleaved_rows).
  std::map<std::string, int64_t> interleaved;
};

// torchtitan's LLaMA-3 module names → transformers' LLaMA names; "" when `name` is not one.
std::string from_titan(const std::string& name) {
  static const std::map<std::string, std::string> top = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"}};
  if (const auto it = top.find(name); it != top.end()) return it->second;
  static const std::vector<std::pair<std::string, std::string>> parts = {
      {".attention.wq.", ".self_attn.q_proj."},    {".attention.wk.", ".self_attn.k_proj."},
      {".attention.wv.", ".self_attn.v_proj."},    {".attention.wo.", ".self_attn.o_proj."},
      {".feed_forward.w1.", ".mlp.gate_proj."},    {".feed_forward.w2.", ".mlp.down_proj."},
      {".feed_forward.w3.", ".mlp.up_proj."},      {".attention_norm.", ".input_layernorm."},
      {".ffn_norm.", ".post_attention_layernorm."}};
  if (!starts_with(name, "layers.")) return "";
  for (const auto& [from, to] : parts) {
    const auto at = name.find(from);
    if (at != std::string::npos) {
      return "model." + name.substr(0, at) + to + name.substr(at + from.size());
    }
  }
  return "";
}

// torchtitan applies the rotary embedding to interleaved pairs (complex multiplication),
// transformers to the two halves of each head (rotate_half); a torchtitan wq / wk holds each
// head's rows in the interleaved order. Row 2j of a head is transformers' row j, row 2j + 1 its
// row d/2 + j: the same function, with the rows of q and k permuted alike within each head.
at::Tensor halved_rows(const at::Tensor& t, int64_t heads) {
  const int64_t d = t.size(0) / heads;
  auto sizes = t.sizes().vec();
  std::vector<int64_t> split = {heads, d / 2, 2};
  split.insert(split.end(), sizes.begin() + 1, sizes.end());
  return t.reshape(split).transpose(1, 2).reshape(sizes).contiguous();
}

// A source under other names, torchtitan's interleaved rows put in transformers' order.
class MappedSource : public TensorSource {
 public:
  MappedSource(SharedTensorSource base, const KeyMap& keys, std::string origin)
      : base_(std::move(base)), interleaved_(keys.interleaved), origin_(std::move(origin)) {
    for (const auto& e : base_->entries()) {
      const auto it = keys.model.find(e.name);
      if (it == keys.model.end() || it->second.empty()) continue;
      entries_.push_back({it->second, e.shape, e.dtype});
      base_name_[it->second] = e.name;
    }
  }
  const std::vector<TensorEntry>& entries() const override { return entries_; }
  std::string origin() const override { return origin_; }
  void read_into(const std::string& name, const std::vector<int64_t>& offsets,
                 at::Tensor dest) const override {
    const auto it = base_name_.find(name);
    if (it == base_name_.end())
      throw InvalidArgument(fmt::format("{}: no tensor '{}'", origin_, name));
    const auto heads = interleaved_.find(name);
    if (heads == interleaved_.end()) return base_->read_into(it->second, offsets, dest);
    at::Tensor whole = halved_rows(base_->read(it->second), heads->second);
    for (int64_t d = 0; d < dest.dim() && !offsets.empty(); ++d) {
      whole = whole.narrow(d, offsets[static_cast<size_t>(d)], dest.size(d));
    }
    dest.copy_(whole);
  }

 private:
  SharedTensorSource base_;
  std::map<std::string, int64_t> interleaved_;
  std::string origin_;
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::string> base_name_;
};

// The model config beside a checkpoint: `folder`/config.json, else the run's.
std::pair<nlohmann::json, std::string> model_config(const std::string& folder) {
  for (const auto& dir : {fs::path(folder), fs::path(folder).parent_path()}) {
    const std::string path = (dir / "config.json").string();
    if (!fs::is_regular_file(path)) continue;
    std::ifstream in(path);
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      throw FormatError(fmt::format("{}: not a JSON object", path));
    }
    return {j, path};
  }
  return {nlohmann::json(), ""};
}

int64_t config_int(const nlohmann::json& config, const std::string& key,
                   const std::string& origin) {
  if (!config.contains(key) || !config[key].is_number_integer() || config[key].get<int64_t>() < 1) {
    throw FormatError(
        fmt::format("{}: \"{}\" is {}, expected a positive integer (torchtitan's "
                    "wq / wk rows are mapped by head)",
                    origin, key, config.contains(key) ? config[key].dump() : "missing"));
  }
  return config[key].get<int64_t>();
}

// The model keys of a DCP save: torchtitan's names mapped onto transformers' LLaMA (with the
// head counts from config.json), "model."-wrapped keys (Accelerate) unwrapped, other keys as
// saved. Optimizer, scheduler, data-loader and train-state entries are not model tensors.
KeyMap model_keys(const TensorSource& dcp, const std::string& strip, const nlohmann::json& config,
                  const std::string& config_file, const std::string& origin) {
  KeyMap keys;
  bool titan = false;
  for (const auto& e : dcp.entries()) titan = titan || e.name == "tok_embeddings.weight";
  for (const auto& e : dcp.entries()) {
    const std::string& key = e.name;
    if (starts_with(key, "optimizer.") || starts_with(key, "lr_scheduler") ||
        starts_with(key, "dataloader") || starts_with(key, "train_state")) {
      continue;
    }
    if (!strip.empty() && !starts_with(key, strip)) continue;
    std::string name = key.substr(strip.size());
    if (titan) {
      const std::string mapped = from_titan(name);
      if (mapped.empty()) {
        throw FormatError(fmt::format(
            "{}: key '{}' is not one of torchtitan's LLaMA-3 names (tok_embeddings, "
            "layers.N.attention.wq/wk/wv/wo, feed_forward.w1/w2/w3, attention_norm, ffn_norm, "
            "norm, output); the architectures tried: torchtitan LLaMA-3",
            origin, key));
      }
      name = mapped;
    }
    keys.model[key] = name;
  }
  if (titan) {
    if (config_file.empty()) {
      throw FormatError(fmt::format(
          "{}: torchtitan's names are mapped onto the LLaMA architecture, whose config.json "
          "(transformers' LlamaConfig: hidden_size, num_attention_heads, num_key_value_heads, ...) "
          "must be in the checkpoint folder or the run directory",
          origin));
    }
    const int64_t heads = config_int(config, "num_attention_heads", config_file);
    const int64_t kv = config.contains("num_key_value_heads")
                           ? config_int(config, "num_key_value_heads", config_file)
                           : heads;
    for (const auto& [key, name] : keys.model) {
      if (name.find(".self_attn.q_proj.weight") != std::string::npos)
        keys.interleaved[name] = heads;
      if (name.find(".self_attn.k_proj.weight") != std::string::npos) keys.interleaved[name] = kv;
    }
  }
  return keys;
}

// The state tensor `e` (optimizer.state.<fqn>.<key>) of parameter `name` as a value: the 'step'
// count read, any other left in the shards under "<name>.<key>", recorded in `stored` (with
// torchtitan's interleaved rows of wq / wk).
Ref state_tensor(const DcpReader& dcp, const TensorEntry& e, const std::string& name,
                 const KeyMap& keys, KeyMap& stored) {
  auto v = make_value(Kind::kTensor);
  v->shape = e.shape;
  v->dtype = e.dtype;
  const std::string key = e.name.substr(e.name.rfind('.') + 1);
  if (key == "step") {
    v->tensor = dcp.read(e.name);
    return v;
  }
  v->text = name + "." + key;
  stored.model[e.name] = v->text;
  const auto heads = keys.interleaved.find(name);
  if (heads != keys.interleaved.end() && !e.shape.empty()) {
    stored.interleaved[v->text] = heads->second;
  }
  return v;
}

// A DCP save's optimizer entries as torch's optimizer.state_dict(): {'state': {index: {key:
// value}}, 'param_groups': [{..., 'params': [indices], 'param_names': [names]}]}. Two forms:
// get_optimizer_state_dict's nested one (optimizer.param_groups.<g>.<key>, with
// optimizer.param_groups.<g>.params listing the names; Accelerate) and its flattened one
// (optimizer.param_groups.<name>.<key>, one per parameter; torchtitan), whose parameters with equal
// hyper-parameters form one group, in order of appearance.
// The state's tensors are left in the shards: each is a tensor value with its shape and dtype,
// whose text names it in `*state_source` ("<parameter>.<key>"), read when a rebuilt step needs it.
// Only the 'step' counts are read now.
Ref optimizer_dict(const DcpReader& dcp, const std::shared_ptr<const DcpReader>& shared,
                   const KeyMap& keys, const std::string& model_strip,
                   SharedTensorSource* state_source) {
  auto name_of = [&](const std::string& fqn) {
    // The optimizer names parameters as the model does; the model's keys may carry a wrapper.
    for (const std::string& key : {model_strip + fqn, fqn}) {
      if (const auto it = keys.model.find(key); it != keys.model.end()) return it->second;
    }
    const std::string titan = from_titan(fqn);
    return titan.empty() ? fqn : titan;
  };
  std::vector<std::string> order;  // model names, by index
  std::map<std::string, int64_t> index;
  auto index_of = [&](const std::string& name) {
    const auto [it, fresh] = index.emplace(name, static_cast<int64_t>(order.size()));
    if (fresh) order.push_back(name);
    return it->second;
  };
  std::map<int64_t, Ref> state;
  auto put_state = [&](const std::string& key, Ref value) {
    const std::string rest = key.substr(std::string(kOptimizerState).size());
    const auto dot = rest.rfind('.');
    if (dot == std::string::npos) return;
    const std::string name = name_of(rest.substr(0, dot));
    Ref& slot = state[index_of(name)];
    if (!slot) slot = make_value(Kind::kDict);
    slot->entries.emplace_back(string_value(rest.substr(dot + 1)), std::move(value));
  };
  KeyMap stored;  // the state tensors' keys → "<parameter>.<key>"
  for (const auto& e : dcp.entries()) {
    if (!starts_with(e.name, kOptimizerState)) continue;
    const size_t from = std::string(kOptimizerState).size();
    const std::string name = name_of(e.name.substr(from, e.name.rfind('.') - from));
    put_state(e.name, state_tensor(dcp, e, name, keys, stored));
  }
  *state_source = std::make_shared<MappedSource>(shared, stored, dcp.folder() + " ['optimizer']");
  std::vector<std::pair<std::string, Ref>> groups;  // group id → dict, in order
  auto group = [&](const std::string& id) -> Ref& {
    for (auto& [g, dict] : groups) {
      if (g == id) return dict;
    }
    groups.emplace_back(id, make_value(Kind::kDict));
    return groups.back().second;
  };
  const bool nested = dcp.has_object(std::string(kOptimizerGroups) + "0.params");
  std::map<std::string, std::vector<std::pair<std::string, Ref>>> flat;  // name → hyper
  std::vector<std::string> flat_order;
  for (const auto& key : dcp.object_keys()) {
    if (starts_with(key, kOptimizerState)) {
      put_state(key, dcp.object(key));
      continue;
    }
    if (!starts_with(key, kOptimizerGroups)) continue;
    const std::string rest = key.substr(std::string(kOptimizerGroups).size());
    const auto dot = nested ? rest.find('.') : rest.rfind('.');
    if (dot == std::string::npos) continue;
    const std::string owner = rest.substr(0, dot), field = rest.substr(dot + 1);
    Ref value = dcp.object(key);
    if (nested) {
      group(owner)->entries.emplace_back(string_value(field), value);
    } else {
      const std::string name = name_of(owner);
      if (!flat.count(name)) flat_order.push_back(name);
      flat[name].emplace_back(field, value);
    }
  }
  if (!nested) {
    // Parameters whose hyper-parameters render alike share a group.
    for (const auto& name : flat_order) {
      std::string id;
      for (const auto& [field, value] : flat[name]) id += field + "=" + value->brief() + ";";
      Ref& g = group(id);
      if (g->entries.empty()) {
        for (const auto& [field, value] : flat[name])
          g->entries.emplace_back(string_value(field), value);
        g->entries.emplace_back(string_value("param_names"), make_value(Kind::kList));
      }
      for (auto& [k, v] : g->entries) {
        if (k->text == "param_names") v->items.push_back(string_value(name));
      }
    }
  }
  auto groups_list = make_value(Kind::kList);
  for (auto& [id, dict] : groups) {
    auto params = make_value(Kind::kList);
    auto names = make_value(Kind::kList);
    std::vector<std::pair<Ref, Ref>> kept;
    for (auto& [k, v] : dict->entries) {
      if (k->text == "params" || k->text == "param_names") {
        for (const auto& n : v->items) {
          if (!n->is(Kind::kString)) {
            throw FormatError(fmt::format("{}: param_group '{}' lists {}, expected names",
                                          dcp.folder(), id, n->brief()));
          }
          const std::string name = name_of(n->text);
          params->items.push_back(int_value(index_of(name)));
          names->items.push_back(string_value(name));
        }
      } else {
        kept.emplace_back(k, v);
      }
    }
    kept.emplace_back(string_value("params"), params);
    kept.emplace_back(string_value("param_names"), names);
    dict->entries = std::move(kept);
    groups_list->items.push_back(dict);
  }
  auto state_dict = make_value(Kind::kDict);
  for (auto& [i, slot] : state) state_dict->entries.emplace_back(int_value(i), slot);
  auto root = make_value(Kind::kDict);
  root->entries.emplace_back(string_value("state"), state_dict);
  root->entries.emplace_back(string_value("param_groups"), groups_list);
  return root;
}

bool has_optimizer(const DcpReader& dcp) {
  for (const auto& e : dcp.entries()) {
    if (starts_with(e.name, kOptimizerState)) return true;
  }
  for (const auto& key : dcp.object_keys()) {
    if (starts_with(key, kOptimizerGroups)) return true;
  }
  return false;
}

// One DCP checkpoint: the model from `model_dcp` (keys under `strip`), the optimizer from
// `optimizer_dcp` when it holds one.
Checkpoint open_dcp(const CheckpointInfo& info, CheckpointParts parts, const std::string& model_dir,
                    const std::string& strip, const std::string& optimizer_dir) {
  Checkpoint ckpt;
  ckpt.step = info.step;
  ckpt.path = info.path;
  auto model_dcp = std::make_shared<const DcpReader>(model_dir);
  const auto [config, config_file] = model_config(info.path);
  const std::string origin = model_dir + "/.metadata";
  const KeyMap keys = model_keys(*model_dcp, strip, config, config_file, origin);
  ckpt.model_file = origin;
  ckpt.model_source = std::make_shared<MappedSource>(model_dcp, keys, origin);
  nlohmann::json meta = nlohmann::json::object();
  meta["step"] = info.step;
  if (!config_file.empty()) {
    meta["model"] = config;
    ckpt.model_config_file = config_file;
  }
  ckpt.meta_file = info.path;
  if (parts == CheckpointParts::kAll && fs::exists(fs::path(optimizer_dir) / ".metadata")) {
    const auto optimizer_dcp =
        optimizer_dir == model_dir ? model_dcp : std::make_shared<const DcpReader>(optimizer_dir);
    if (has_optimizer(*optimizer_dcp)) {
      ckpt.optimizer_file = optimizer_dir + " ['optimizer']";
      SharedTensorSource state;
      const Ref dict = optimizer_dict(*optimizer_dcp, optimizer_dcp, keys, strip, &state);
      auto indexed = torch_state::optimizer_state_dict(*dict, ckpt.optimizer_file, meta);
      indexed->source = std::move(state);
      ckpt.indexed_optimizer = std::move(indexed);
      ckpt.meta_file = ckpt.optimizer_file;
    }
  }
  ckpt.meta = parse_checkpoint_meta(meta.dump(), ckpt.meta_file);
  return ckpt;
}

std::optional<int64_t> step_after(const std::string& entry, const std::string& prefix) {
  if (!starts_with(entry, prefix)) return std::nullopt;
  return step_number(entry.substr(prefix.size()));
}

class TorchtitanLayout : public CheckpointLayoutReader {
 public:
  std::string name() const override { return "torchtitan"; }
  std::string brief() const override { return "DCP folders step-<N>/.metadata"; }
  bool holds(const std::string& path, const std::string& entry) const override {
    return step_after(entry, "step-") && is_dcp_folder(path);
  }
  int64_t step(const std::string&, const std::string& entry) const override {
    return *step_after(entry, "step-");
  }
  bool looks_like_one_checkpoint(const std::string& dir) const override {
    return is_dcp_folder(dir);
  }
  Checkpoint open(const CheckpointInfo& info, CheckpointParts parts) const override {
    return open_dcp(info, parts, info.path, "", info.path);
  }
};

class AccelerateLayout : public CheckpointLayoutReader {
 public:
  std::string name() const override { return "accelerate"; }
  std::string brief() const override { return "checkpoint-<N>/pytorch_model_fsdp_0/.metadata"; }
  std::string expected() const override {
    return "checkpoint-<N>/ folders with a DCP save in pytorch_model_fsdp_0/";
  }
  bool holds(const std::string& path, const std::string& entry) const override {
    return step_after(entry, "checkpoint-") && is_dcp_folder(path + "/pytorch_model_fsdp_0");
  }
  int64_t step(const std::string&, const std::string& entry) const override {
    return *step_after(entry, "checkpoint-");
  }
  bool looks_like_one_checkpoint(const std::string& dir) const override {
    return is_dcp_folder(dir + "/pytorch_model_fsdp_0");
  }
  Checkpoint open(const CheckpointInfo& info, CheckpointParts parts) const override {
    // save_fsdp_model saves {"model": state_dict}, save_fsdp_optimizer {"optimizer": ...}.
    return open_dcp(info, parts, info.path + "/pytorch_model_fsdp_0", "model.",
                    info.path + "/optimizer_0");
  }
};

}  // namespace

std::shared_ptr<const CheckpointLayoutReader> torchtitan_layout() {
  return std::make_shared<TorchtitanLayout>();
}

std::shared_ptr<const CheckpointLayoutReader> accelerate_layout() {
  return std::make_shared<AccelerateLayout>();
}

}  // namespace curv
