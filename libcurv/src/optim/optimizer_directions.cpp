#include "curv/optim/optimizer_directions.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "core/strings.h"
#include "curv/core/checkpoint_meta.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/optim/optimizers.h"

namespace curv {

namespace {

// θ in the engine's vector dtype, which the rebuilt step is computed and kept in: a 16-bit
// model's step from its (float32) saved state without a 16-bit rounding of θ, the state or the
// step. The same tensors where θ already is in that dtype.
ParamVector in_vector_dtype(const DirectionContext& c) {
  return converted(c.theta, c.engine->vector_dtype());
}

// The optimizer configured as the record says (one parameter group's hyper-parameters on top
// when given), then `overrides`. Stored hyper-parameters hold every field (checkpoints record
// them all), so they are applied whether this optimizer reads them or not; only the overrides
// are checked.
std::unique_ptr<Optimizer> optimizer_for_group(const SavedOptimizer& saved, const ParamSpace& space,
                                               const OptimizerParamGroup* group,
                                               const KeyValues& overrides) {
  OptimizerConfig config = OptimizerConfig::defaults(saved.record.name);
  for (const auto& [key, fallback] : config.hyper()) {
    double v = saved.hyper(key, fallback);
    if (group) {
      for (const auto& [k, value] : group->hyper) {
        if (k == key) v = value;
      }
    }
    config.set_stored(key, fmt::format("{}", v));
  }
  // The partition regex travels beside the numeric hyper-parameters.
  if (saved.record.muon_params) config.muon_params = *saved.record.muon_params;
  for (const auto& [k, v] : overrides) config.set(k, v);
  config.validate();
  return make_optimizer(config, space);
}

// "adamw", "adamw:lr=1e-3", "muon.whatif", "muon.whatif:match=1,lr=0.01", "update".
class OptimizerDirection : public Direction {
 public:
  explicit OptimizerDirection(const std::string& spec) {
    const auto colon = spec.find(':');
    std::string head = spec.substr(0, colon);
    const auto dot = head.find('.');
    family_ = head.substr(0, dot);
    if (dot != std::string::npos) {
      if (head.substr(dot + 1) != "whatif") {
        throw InvalidArgument(
            fmt::format("direction '{}': expected {} or {}.whatif", spec, family_, family_));
      }
      whatif_ = true;
    }
    // "update" resolves to the optimizer named in each checkpoint's meta.json.
    if (family_ == "update" && whatif_) {
      throw InvalidArgument(
          fmt::format("direction '{}': update is rebuilt from saved state; "
                      "what-if steps name their optimizer (e.g. adamw.whatif)",
                      spec));
    }
    if (family_ != "update") OptimizerConfig::defaults(family_);
    if (colon != std::string::npos) {
      for (const auto& [key, value] :
           parse_key_values(spec.substr(colon + 1), "direction '" + spec + "'")) {
        if (key == "match") {
          if (!whatif_) {
            throw InvalidArgument(
                fmt::format("direction '{}': match applies to what-if steps "
                            "({}.whatif:match=1)",
                            spec, family_));
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
  bool reads_next_checkpoint() const override { return match_; }

  std::string unavailable(const DirectionContext& c) const override {
    if (match_ && c.theta_next.empty()) return "no next checkpoint whose delta norm to match";
    if (!whatif_ && !c.saved && !c.whatif_fallback) return "no checkpoint with optimizer state";
    return "";
  }

  ParamVector compute(DirectionContext& c) override {
    if (family_ == "update") return update_step(c);
    std::string why;
    if (!whatif_) {
      auto optimizer = rebuild_from_saved(c, &why);
      if (optimizer) return rebuilt_step(c, *optimizer);
      if (!c.whatif_fallback) {
        throw InvalidArgument(
            Error::literal(fmt::format("direction {} at {}: {} (use the {}.whatif direction, or ",
                                       name_, where(c), why, family_)) +
                "{0})",
            {{"ProbeRunOptions.whatif_fallback", ""}});
      }
    }
    ParamVector u = whatif_step(c, why);
    if (match_) match_delta_norm(c, u);
    return u;
  }

 private:
  static std::string where(const DirectionContext& c) {
    return c.saved ? c.saved->checkpoint : "step " + std::to_string(c.step);
  }

  // "update": the direction of the optimizer the checkpoint names, with this one's overrides.
  ParamVector update_step(DirectionContext& c) const {
    const std::string saved = c.saved ? c.saved->record.name : "";
    if (saved.empty() && c.saved && !c.saved->record.refusal.empty()) {
      throw InvalidArgument(
          fmt::format("direction update at {}: {}", where(c), c.saved->record.refusal));
    }
    if (saved.empty()) {
      throw InvalidArgument(
          fmt::format("direction update at {}: the checkpoint's meta.json "
                      "names no optimizer",
                      where(c)));
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

  // Step 1 and 2 of a rebuilt step: the optimizer the checkpoint's record describes, once the
  // checkpoint is known to hold the state it needs; null, with `why`, when the checkpoint cannot
  // give this optimizer's step.
  std::unique_ptr<Optimizer> rebuild_from_saved(const DirectionContext& c, std::string* why) const {
    const SavedOptimizer* saved = c.saved;
    if (!saved) {
      *why = "no checkpoint";
      return nullptr;
    }
    const std::string& name = saved->record.name;
    if (name.empty()) {
      *why = saved->record.refusal.empty() ? "its meta.json names no optimizer"
                                           : saved->record.refusal;
      return nullptr;
    }
    if (name != family_) {
      *why = fmt::format("it was saved by optimizer '{}', not '{}'", name, family_);
      return nullptr;
    }
    if (saved->unresolved) {
      *why =
          "its torch optimizer state is not mapped to parameter names yet "
          "(resolve_optimizer_state)";
      return nullptr;
    }
    auto optimizer = optimizer_for_group(*saved, c.engine->space(), nullptr, overrides_);
    if (!saved->has_state() && saved->step_count() != 0 && optimizer->needs_saved_state()) {
      *why = "it has no saved optimizer state";
      return nullptr;
    }
    return optimizer;
  }

  // Step 3: the rebuilt optimizer's next step, per parameter group (rebuild_saved_step).
  ParamVector rebuilt_step(DirectionContext& c, const Optimizer& optimizer) const {
    const SavedOptimizer& saved = *c.saved;
    RebuiltStep step = rebuild_saved_step(saved, c.engine->space(), in_vector_dtype(c),
                                          c.engine->gradient(), overrides_);
    c.note = step.note;
    c.optimizer_rule = family_;
    c.optimizer_recognition = saved.record.recognition.empty() ? "recorded in " + saved.meta_file
                                                               : saved.record.recognition;
    c.partition = optimizer.partition();
    return std::move(step.u);
  }

  // The step from fresh state, configured by the defaults and the direction's overrides.
  ParamVector whatif_step(DirectionContext& c, const std::string& why) const {
    c.note =
        why.empty() ? "what-if step from fresh state" : "what-if step from fresh state: " + why;
    OptimizerConfig config = OptimizerConfig::defaults(family_);
    for (const auto& [k, v] : overrides_) config.set(k, v);
    auto optimizer = make_optimizer(config, c.engine->space());
    c.partition = optimizer->partition();
    return optimizer->step(in_vector_dtype(c), c.engine->gradient());
  }

  // Step 4 of match=1: rescales u to the norm of the delta to the next checkpoint.
  static void match_delta_norm(DirectionContext& c, ParamVector& u) {
    const double want = norm(sub(c.theta_next, c.theta, c.engine->vector_dtype())), have = norm(u);
    if (have > 0) u = scaled(u, want / have);
    c.note += fmt::format(", rescaled to the delta's norm {:.6g}", want);
  }

  std::string family_, name_;
  bool whatif_ = false, match_ = false;
  std::vector<std::pair<std::string, std::string>> overrides_;
};

DirectionFactory optimizer_direction_factory() {
  return [](const std::string& spec) { return std::make_unique<OptimizerDirection>(spec); };
}

}  // namespace

std::vector<std::tuple<std::string, DirectionFactory, std::string>> optimizer_direction_families() {
  std::vector<std::tuple<std::string, DirectionFactory, std::string>> out;
  for (const auto& entry : optimizer_table()) {
    out.emplace_back(
        entry.name, optimizer_direction_factory(),
        fmt::format("{0}'s step rebuilt from the checkpoint's saved state; {0}.whatif from fresh "
                    "state ({0}.whatif:match=1 rescales it to the delta's norm)",
                    entry.name));
  }
  out.emplace_back("update", optimizer_direction_factory(),
                   "the step of the optimizer that saved each checkpoint, rebuilt from its saved "
                   "state");
  return out;
}

RebuiltStep rebuild_saved_step(const SavedOptimizer& saved, const ParamSpace& space,
                               const ParamVector& theta, const ParamVector& grad,
                               const KeyValues& overrides) {
  const std::string& rule = saved.record.name;
  if (rule.empty()) {
    throw InvalidArgument(
        fmt::format("{}: {}", saved.checkpoint,
                    saved.record.refusal.empty() ? "names no optimizer" : saved.record.refusal));
  }
  if (saved.unresolved) {
    throw InvalidArgument(fmt::format(
        "{}: the torch optimizer state is not mapped to parameter names (resolve_optimizer_state)",
        saved.checkpoint));
  }
  if (theta.size() != space.size() || grad.size() != space.size()) {
    throw InvalidArgument(fmt::format("rebuild_saved_step: {} parameters, {} values, {} gradients",
                                      space.size(), theta.size(), grad.size()));
  }
  // A first step (step count 0) and stateless rules read nothing: an empty source serves them.
  // Each parameter's saved state is read when its step is taken and dropped after
  // (Optimizer::step_from_saved): the whole state, twice the parameters for Adam, is never held.
  const SharedTensorSource state = saved.state ? saved.state : memory_tensor_source({}, saved.file);
  RebuiltStep out;
  out.rule = rule;
  out.note = fmt::format("rebuilt from saved {} state (step count {})", rule, saved.step_count());
  out.u.resize(space.size());
  // Parameter groups with their own hyper-parameters (nanoGPT: no weight decay on gains and
  // biases; modded-nanogpt: one learning rate per AdamW group) take their step from an optimizer
  // configured like the group, built over the group's parameters only, so that each parameter's
  // step (a Newton–Schulz iteration for Muon's matrices) is computed once whatever the groups.
  std::string left_out;
  auto step_of = [&](const std::vector<size_t>& indices, const OptimizerParamGroup* group) {
    std::vector<std::string> names;
    ParamVector sub_theta, sub_grad;
    for (size_t i : indices) {
      names.push_back(space[i].name);
      sub_theta.push_back(theta[i]);
      sub_grad.push_back(grad[i]);
    }
    auto sub = optimizer_for_group(saved, ParamSpace(names, sub_theta), group, overrides);
    const ParamVector sub_u =
        sub->step_from_saved(sub_theta, sub_grad, *state, saved.step_count(), saved.file);
    for (size_t k = 0; k < indices.size(); ++k) out.u[indices[k]] = sub_u[k];
    // What a rule's rebuilt step leaves out of the reference's step goes into the note.
    if (!sub->step_note().empty()) left_out = sub->step_note();
  };
  const auto& groups = saved.record.param_groups;
  std::vector<bool> grouped(space.size(), false);
  for (size_t k = 0; k < groups.size(); ++k) {
    std::vector<size_t> indices;
    for (const auto& name : groups[k].params) {
      const auto index = space.find(name);
      if (!index) {
        throw FormatError(
            fmt::format("{}: \"optimizer.param_groups[{}]\" names \"{}\", which "
                        "is not a model parameter",
                        saved.meta_file, k, name));
      }
      if (!grouped[*index]) indices.push_back(*index);
      grouped[*index] = true;
    }
    if (!indices.empty()) step_of(indices, &groups[k]);
  }
  std::vector<size_t> rest;
  for (size_t i = 0; i < space.size(); ++i) {
    if (!grouped[i]) rest.push_back(i);
  }
  if (!rest.empty()) step_of(rest, nullptr);
  if (groups.size() > 1) out.note += fmt::format(", {} parameter groups", groups.size());
  if (!left_out.empty()) out.note += "; " + left_out;
  return out;
}

}  // namespace curv
