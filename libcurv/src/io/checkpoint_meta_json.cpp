// meta.json: its text parsed into the typed CheckpointMeta, and written back from it.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "curv/core/error.h"
#include "curv/io/checkpoint.h"

namespace curv {

namespace {

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
  for (const auto& [key, field] :
       {std::pair{"recognition", &r.recognition}, std::pair{"refusal", &r.refusal}}) {
    if (!opt.contains(key)) continue;
    expect(opt[key].is_string(), origin, std::string("optimizer.") + key, "a string", opt[key]);
    *field = opt[key].get<std::string>();
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

}  // namespace

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
    if (!r.recognition.empty()) opt["recognition"] = r.recognition;
    if (!r.refusal.empty()) opt["refusal"] = r.refusal;
    if (r.name.empty()) opt.erase("name");
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

}  // namespace curv
