#include "optim/optimizer_directions.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "curv/io/checkpoint.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/optim/optimizers.h"
#include "core/strings.h"

namespace curv {

namespace {

// "adamw", "adamw:lr=1e-3", "muon.whatif", "muon.whatif:match=1,lr=0.01".
class OptimizerDirection : public Direction {
 public:
  explicit OptimizerDirection(const std::string& spec) {
    const auto colon = spec.find(':');
    std::string head = spec.substr(0, colon);
    const auto dot = head.find('.');
    family_ = head.substr(0, dot);
    if (dot != std::string::npos) {
      if (head.substr(dot + 1) != "whatif") {
        throw InvalidArgument(fmt::format("direction '{}': expected {} or {}.whatif", spec, family_,
                                          family_));
      }
      whatif_ = true;
    }
    // "update" resolves to the optimizer named in each checkpoint's meta.json.
    if (family_ == "update" && whatif_) {
      throw InvalidArgument(fmt::format("direction '{}': update is rebuilt from saved state; "
                                        "what-if steps name their optimizer (e.g. adamw.whatif)", spec));
    }
    if (family_ != "update") OptimizerConfig::defaults(family_);
    if (colon != std::string::npos) {
      for (const auto& [key, value] :
           parse_key_values(spec.substr(colon + 1), "direction '" + spec + "'")) {
        if (key == "match") {
          if (!whatif_) {
            throw InvalidArgument(fmt::format("direction '{}': match applies to what-if steps "
                                              "({}.whatif:match=1)", spec, family_));
          }
          match_ = value == "1" || value == "true";
        } else {
          if (family_ != "update") {
            OptimizerConfig probe = OptimizerConfig::defaults(family_);
            probe.set(key, value);  // validates the key and value now, not at the first checkpoint
          }
          overrides_.emplace_back(key, value);
        }
      }
    }
    name_ = whatif_ ? family_ + ".whatif" : family_;
    if (match_) name_ += ".match";
  }

  std::string name() const override { return name_; }

  std::string unavailable(const DirectionContext& c) const override {
    if (match_ && c.theta_next.empty()) return "no next checkpoint whose delta norm to match";
    if (!whatif_ && !c.current && !c.whatif_fallback) return "no checkpoint with optimizer state";
    return "";
  }

  ParamVector compute(DirectionContext& c) override {
    if (family_ == "update") {
      const std::string saved = c.current ? c.current->optimizer_name() : "";
      if (saved.empty()) {
        throw InvalidArgument(fmt::format("direction update at {}: the checkpoint's meta.json "
                                          "names no optimizer", c.current ? c.current->path : "step " + std::to_string(c.step)));
      }
      std::string spec = saved;
      for (size_t i = 0; i < overrides_.size(); ++i) {
        spec += (i ? "," : ":") + overrides_[i].first + "=" + overrides_[i].second;
      }
      OptimizerDirection resolved(spec);
      ParamVector u = resolved.compute(c);
      c.note = "update = " + saved + ": " + c.note;
      return u;
    }
    const ParamSpace& space = c.engine->space();
    const ParamVector& g = c.engine->gradient();
    if (!whatif_) {
      const std::string why = saved_state_problem(c);
      if (why.empty()) {
        const std::string source = c.current->optimizer_file.empty()
                                       ? c.current->path + "/optimizer.safetensors"
                                       : c.current->optimizer_file;
        auto rebuilt = [&](const nlohmann::json* group_hyper) {
          auto optimizer = make_optimizer(config_from(*c.current, group_hyper), space);
          optimizer->load_state(c.current->optimizer, c.current->step_count().value_or(c.step),
                                source);
          return optimizer;
        };
        auto optimizer = rebuilt(nullptr);
        c.note = fmt::format("rebuilt from saved {} state (step count {})", family_,
                             optimizer->step_count());
        c.partition = optimizer->partition();
        ParamVector u = optimizer->peek(c.theta, g);
        // Parameter groups with their own hyper-parameters (nanoGPT: no weight decay on gains
        // and biases) take their step from an optimizer configured like the group.
        const auto meta = nlohmann::json::parse(c.current->meta_json, nullptr, false);
        const auto* groups = meta.is_object() && meta.contains("optimizer") &&
                                     meta["optimizer"].is_object() &&
                                     meta["optimizer"].contains("param_groups") &&
                                     meta["optimizer"]["param_groups"].is_array()
                                 ? &meta["optimizer"]["param_groups"]
                                 : nullptr;
        for (size_t k = 0; groups && k < groups->size(); ++k) {
          const auto& group = (*groups)[k];
          if (!group.is_object() || !group.contains("params") || !group["params"].is_array() ||
              !group.contains("hyper") || !group["hyper"].is_object()) {
            throw FormatError(fmt::format("{}: \"optimizer.param_groups[{}]\" must be an object "
                                          "with \"params\" (names) and \"hyper\"",
                                          c.current->meta_file, k));
          }
          const ParamVector group_u = rebuilt(&group["hyper"])->peek(c.theta, g);
          for (const auto& name : group["params"]) {
            const auto index = name.is_string() ? space.find(name.get<std::string>()) : std::nullopt;
            if (!index) {
              throw FormatError(fmt::format("{}: \"optimizer.param_groups[{}]\" names {}, which "
                                            "is not a model parameter", c.current->meta_file, k,
                                            name.dump()));
            }
            u[*index] = group_u[*index];
          }
        }
        if (groups && groups->size() > 1) c.note += fmt::format(", {} parameter groups", groups->size());
        return u;
      }
      if (!c.whatif_fallback) {
        throw InvalidArgument(fmt::format("direction {} at {}: {} (use the {}.whatif direction, "
                                          "or --whatif-fallback)", name_,
                                          c.current ? c.current->path : "step " + std::to_string(c.step),
                                          why, family_));
      }
      c.note = "what-if step from fresh state: " + why;
    } else {
      c.note = "what-if step from fresh state";
    }
    OptimizerConfig config = OptimizerConfig::defaults(family_);
    for (const auto& [k, v] : overrides_) config.set(k, v);
    auto optimizer = make_optimizer(config, space);
    c.partition = optimizer->partition();
    ParamVector u = optimizer->peek(c.theta, g);
    if (match_) {
      const double want = norm(sub(c.theta_next, c.theta)), have = norm(u);
      if (have > 0) u = scaled(u, want / have);
      c.note += fmt::format(", rescaled to the delta's norm {:.6g}", want);
    }
    return u;
  }

 private:
  // "" when the checkpoint has this optimizer's saved state, else why not.
  std::string saved_state_problem(const DirectionContext& c) const {
    if (!c.current) return "no checkpoint";
    const std::string saved = c.current->optimizer_name();
    if (saved.empty()) return "its meta.json names no optimizer";
    if (saved != family_) return fmt::format("it was saved by optimizer '{}', not '{}'", saved, family_);
    if (c.current->indexed_optimizer) {
      return "its torch optimizer state is not mapped to parameter names yet "
             "(resolve_optimizer_state)";
    }
    if (c.current->optimizer.empty() && c.current->step_count().value_or(c.step) != 0 &&
        family_ != "signsgd" &&
        !(family_ == "sgd" && c.current->hyper("momentum", 0.0) == 0.0)) {
      return "it has no saved optimizer state";
    }
    return "";
  }

  // The checkpoint's hyper-parameters, those of one of its parameter groups on top when given,
  // then the direction's own overrides.
  OptimizerConfig config_from(const Checkpoint& ckpt, const nlohmann::json* group_hyper = nullptr) const {
    OptimizerConfig config = OptimizerConfig::defaults(family_);
    for (const auto& [key, value] : config.hyper()) {
      double v = ckpt.hyper(key, value);
      if (group_hyper && group_hyper->contains(key)) {
        if (!(*group_hyper)[key].is_number()) {
          throw FormatError(fmt::format("{}: parameter group hyper-parameter \"{}\" must be a "
                                        "number, got {}", ckpt.meta_file, key,
                                        (*group_hyper)[key].dump()));
        }
        v = (*group_hyper)[key].get<double>();
      }
      config.set(key, fmt::format("{}", v));
    }
    // The partition regex travels beside the numeric hyper-parameters.
    const auto meta = nlohmann::json::parse(ckpt.meta_json, nullptr, false);
    if (meta.is_object() && meta.contains("optimizer") && meta["optimizer"].is_object() &&
        meta["optimizer"].contains("muon_params") && meta["optimizer"]["muon_params"].is_string()) {
      config.muon_params = meta["optimizer"]["muon_params"].get<std::string>();
    }
    for (const auto& [k, v] : overrides_) config.set(k, v);
    config.validate();
    return config;
  }

  std::string family_, name_;
  bool whatif_ = false, match_ = false;
  std::vector<std::pair<std::string, std::string>> overrides_;
};

}  // namespace

std::vector<std::tuple<std::string, DirectionFactory, std::string>> optimizer_direction_families() {
  std::vector<std::tuple<std::string, DirectionFactory, std::string>> out;
  for (const char* name : {"adamw", "muon", "normuon", "sgd", "signsgd", "signum", "lion"}) {
    out.emplace_back(
        name, [](const std::string& spec) { return std::make_unique<OptimizerDirection>(spec); },
        fmt::format("{0}'s step rebuilt from the checkpoint's saved state; {0}.whatif from fresh "
                    "state ({0}.whatif:match=1 rescales it to the delta's norm)", name));
  }
  out.emplace_back(
      "update", [](const std::string& spec) { return std::make_unique<OptimizerDirection>(spec); },
      "the step of the optimizer that saved each checkpoint, rebuilt from its saved state");
  return out;
}

}  // namespace curv
