// Several optimizers' states saved side by side as a list, the way a training script that steps
// torch.optim.Muon on its matrices and torch.optim.AdamW on the rest saves them
// ('optimizer': [muon.state_dict(), adamw.state_dict()]): read as one state of the torch-muon rule.
#include <fmt/format.h>

#include <algorithm>

#include "core/strings.h"
#include "curv/core/error.h"
#include "io/torch_checkpoint.h"

namespace curv::torch_state {

namespace {

using Kind = PyValue::Kind;

struct Part {
  std::shared_ptr<IndexedOptimizerState> state;
  nlohmann::json record;  // meta["optimizer"] of the part alone
  std::string origin;
  std::string rule() const { return record.value("name", std::string()); }
};

int64_t index_count(const IndexedOptimizerState& state) {
  int64_t count = 0;
  for (const auto& g : state.groups) {
    for (int64_t p : g.params) count = std::max(count, p + 1);
  }
  return count;
}

// `part`'s groups and state appended to `out` with its indices moved up by `offset`.
void append(IndexedOptimizerState& out, IndexedOptimizerState& part, int64_t offset,
            bool orthogonalised) {
  for (auto& g : part.groups) {
    for (auto& p : g.params) p += offset;
    g.use_muon = orthogonalised;
    if (!orthogonalised) g.hyper = adam_part_hyper(g.hyper);
    out.groups.push_back(std::move(g));
  }
  for (auto& [index, tensors] : part.state) out.state.emplace(index + offset, std::move(tensors));
  for (auto& [key, name] : part.stored_as) out.stored_as[{key.first + offset, key.second}] = name;
  if (part.source) out.source = part.source;
}

}  // namespace

std::shared_ptr<IndexedOptimizerState> optimizer_list(const PyValue& list,
                                                      const std::string& origin,
                                                      nlohmann::json& meta) {
  std::vector<Part> parts;
  for (size_t k = 0; k < list.items.size(); ++k) {
    Part part;
    part.origin = fmt::format("{}[{}]", origin, k);
    if (!list.items[k]->is(Kind::kDict)) {
      throw FormatError(fmt::format("{}: is {}, expected an optimizer's state_dict()", part.origin,
                                    list.items[k]->brief()));
    }
    nlohmann::json part_meta = nlohmann::json::object();
    part.state = optimizer_state_dict(*list.items[k], part.origin, part_meta);
    part.record = part_meta["optimizer"];
    parts.push_back(std::move(part));
  }
  auto out = std::make_shared<IndexedOptimizerState>();
  out->origin = origin;
  nlohmann::json record = nlohmann::json::object();
  std::vector<std::string> rules, refusals;
  for (const auto& part : parts) {
    rules.push_back(part.rule().empty() ? "refused" : part.rule());
    if (part.rule().empty()) refusals.push_back(part.record.value("refusal", std::string()));
  }
  const auto muon = std::find_if(parts.begin(), parts.end(),
                                 [](const Part& p) { return p.rule() == "torch-muon"; });
  const auto adamw =
      std::find_if(parts.begin(), parts.end(), [](const Part& p) { return p.rule() == "adamw"; });
  const bool pair = parts.size() == 2 && muon != parts.end() && adamw != parts.end();
  if (!pair) {
    // The model still loads; the groups, one after the other, keep the parameter count.
    int64_t offset = 0;
    for (auto& part : parts) {
      const int64_t count = index_count(*part.state);
      append(*out, *part.state, offset, false);
      offset += count;
    }
    record["refusal"] =
        !refusals.empty()
            ? join(refusals, "; ")
            : fmt::format(
                  "{}: a list of {} optimizer states ({}); libcurv rebuilds a list only "
                  "as torch.optim.Muon with torch.optim.AdamW; audit it along delta",
                  origin, parts.size(), join(rules, ", "));
    meta["optimizer"] = record;
    return out;
  }
  // Muon's parameters first, then AdamW's: each optimizer's in its model order is the "hidden"
  // parameter order (hidden matrices first).
  const int64_t muon_count = index_count(*muon->state);
  append(*out, *muon->state, 0, true);
  append(*out, *adamw->state, muon_count, false);
  record["name"] = "torch-muon";
  record["recognition"] = fmt::format(
      "torch.optim.Muon with torch.optim.AdamW ({} and {}), each recognised by its "
      "keys: {}; {}",
      muon->origin, adamw->origin, muon->record.value("recognition", std::string()),
      adamw->record.value("recognition", std::string()));
  nlohmann::json hyper = muon->record.value("hyper", nlohmann::json::object());
  hyper.update(adam_part_hyper(adamw->record.value("hyper", nlohmann::json::object())));
  record["hyper"] = hyper;
  for (const auto& part : parts) {
    if (part.record.contains("step_count")) {
      record["step_count"] = std::max(record.value("step_count", int64_t{0}),
                                      part.record["step_count"].get<int64_t>());
    }
  }
  meta["optimizer"] = record;
  return out;
}

}  // namespace curv::torch_state
