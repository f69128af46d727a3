#include "io/torch_optimizer_rules.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/strings.h"

namespace curv::torch_state {

namespace {

// One kind of param_group a rule's writer makes.
struct GroupShape {
  std::vector<std::string> state;  // per-parameter state, all present once a parameter has any
  // Per-parameter state a parameter may or may not have (Adafactor's row_var and col_var for
  // matrices, variance for vectors).
  std::vector<std::string> optional_state;
  std::vector<std::string> reads;    // param_group keys the rebuilt step reads
  std::vector<std::string> markers;  // keys the writer always records: recognition needs them
  // Boolean keys accepted with one value only (absent is fine unless a marker).
  std::vector<std::pair<std::string, bool>> flags;
  // String keys accepted with one value only (MARS's mars_type).
  std::vector<std::pair<std::string, std::string>> texts;
  bool orthogonalised = false;  // its parameters take the Muon step

  GroupShape(std::vector<std::string> state, std::vector<std::string> reads,
             std::vector<std::string> markers, std::vector<std::pair<std::string, bool>> flags,
             bool orthogonalised = false, std::vector<std::string> optional_state = {},
             std::vector<std::pair<std::string, std::string>> texts = {})
      : state(std::move(state)),
        optional_state(std::move(optional_state)),
        reads(std::move(reads)),
        markers(std::move(markers)),
        flags(std::move(flags)),
        texts(std::move(texts)),
        orthogonalised(orthogonalised) {}
};

struct Rule {
  std::string name;    // libcurv's rule, what --optimizer names
  std::string writer;  // the class (and package) that saves this state
  std::vector<GroupShape> shapes;
  // Recognised but not rebuilt: the reason, given instead of a step.
  std::string refusal;
  // Its writer records nothing another rule's would not: it is read only when named.
  bool named_only = false;
};

// Keys no rule reads and every rule may meet: implementation switches that leave the step as it
// is (foreach, fused, capturable, differentiable), the scheduler's initial_lr, and the indices
// and names of the group's parameters.
const std::vector<std::string> kIgnored = {"params", "param_names", "initial_lr",    "foreach",
                                           "fused",  "capturable",  "differentiable"};
// torch.optim's maximize ascends; false is the only value a rebuilt step follows. Every rule
// checks it (misfit), so no shape lists it among its flags.
const std::pair<std::string, bool> kNotMaximize = {"maximize", false};

// torch.optim's classes and the reference optimizers (Keller Jordan's Muon, lion-pytorch's Lion).
std::vector<Rule> torch_rules() {
  const std::vector<std::string> adam_state = {"exp_avg", "exp_avg_sq"};
  const std::vector<std::string> adam_reads = {"lr", "betas", "eps", "weight_decay"};
  GroupShape adamw{adam_state,
                   adam_reads,
                   {"amsgrad", "decoupled_weight_decay"},
                   {{"amsgrad", false}, {"decoupled_weight_decay", true}}};
  GroupShape adam{adam_state,
                  adam_reads,
                  {"amsgrad", "decoupled_weight_decay"},
                  {{"amsgrad", false}, {"decoupled_weight_decay", false}}};
  GroupShape sgd{{"momentum_buffer"},
                 {"lr", "momentum", "dampening", "weight_decay", "nesterov"},
                 {"dampening", "nesterov"},
                 {}};
  GroupShape muon_group{{"momentum_buffer"},
                        {"lr", "momentum", "weight_decay"},
                        {"use_muon"},
                        {{"use_muon", true}},
                        true};
  GroupShape aux_adam{adam_state, adam_reads, {"use_muon"}, {{"use_muon", false}}};
  // Keller Jordan's plain Muon records nothing SGD or another momentum method would not: it is
  // read only when named.
  GroupShape plain_muon{{"momentum_buffer"}, {"lr", "momentum", "weight_decay"}, {}, {}, true};
  GroupShape lion{{"exp_avg"}, {"lr", "betas", "weight_decay"}, {"betas"}, {}};
  GroupShape torch_muon{{"momentum_buffer"},
                        {"lr", "weight_decay", "momentum", "nesterov", "ns_coefficients",
                         "ns_steps", "eps", "adjust_lr_fn"},
                        {"ns_coefficients", "adjust_lr_fn"},
                        {},
                        true};
  GroupShape nadam{
      {"exp_avg", "exp_avg_sq", "mu_product"},
      {"lr", "betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay"},
      {"momentum_decay"},
      {}};
  GroupShape radam{
      adam_state, {"lr", "betas", "eps", "weight_decay", "decoupled_weight_decay"}, {}, {}};
  GroupShape adafactor{{},
                       {"lr", "beta2_decay", "eps", "d", "weight_decay"},
                       {"beta2_decay", "d"},
                       {},
                       false,
                       {"row_var", "col_var", "variance"}};
  return std::vector<Rule>{
      {"adamw", "torch.optim.AdamW", {adamw}, ""},
      {"adam", "torch.optim.Adam", {adam}, ""},
      {"sgd", "torch.optim.SGD", {sgd}, ""},
      {"muon", "Keller Jordan's MuonWithAuxAdam", {muon_group, aux_adam}, ""},
      {"muon", "Keller Jordan's Muon", {plain_muon}, "", true},
      {"lion", "lion-pytorch's Lion", {lion}, ""},
      {"torch-muon", "torch.optim.Muon", {torch_muon}, ""},  // with AdamW: optimizer_list
      {"nadam", "torch.optim.NAdam", {nadam}, ""},
      {"radam", "torch.optim.RAdam", {radam}, ""},
      {"adafactor", "torch.optim.Adafactor", {adafactor}, ""},
  };
}

// pytorch-optimizer's and schedulefree's classes. pytorch-optimizer keeps its step count in each
// group ('step').
std::vector<Rule> package_rules() {
  const std::vector<std::string> adam_state = {"exp_avg", "exp_avg_sq"};
  GroupShape ademamix{{"exp_avg", "exp_avg_sq", "exp_avg_slow"},
                      {"lr", "betas", "weight_decay", "weight_decouple", "fixed_decay", "alpha",
                       "t_alpha_beta3", "eps", "step"},
                      {"alpha", "t_alpha_beta3"},
                      {}};
  GroupShape soap{{"exp_avg", "exp_avg_sq", "GG", "Q", "precondition_frequency", "shampoo_beta"},
                  {"lr", "betas", "shampoo_beta", "weight_decay", "precondition_frequency",
                   "max_precondition_dim", "precondition_1d", "correct_bias", "normalize_gradient",
                   "eps", "step"},
                  {"shampoo_beta", "precondition_frequency", "max_precondition_dim"},
                  {{"merge_dims", false}}};
  // AdaMuon: groups marked use_muon, each with pytorch-optimizer's 'step'.
  GroupShape adamuon_muon{{"m", "v"},
                          {"lr", "betas", "weight_decay", "weight_decouple", "ns_steps",
                           "ns_coeffs", "use_adjusted_lr", "eps", "step"},
                          {"use_muon", "ns_coeffs", "use_adjusted_lr"},
                          {{"use_muon", true}},
                          true};
  GroupShape adamuon_adam{adam_state,
                          {"lr", "betas", "weight_decay", "weight_decouple", "eps", "step"},
                          {"use_muon", "weight_decouple"},
                          {{"use_muon", false}}};
  // MARS of its default AdamW type; its lion and shampoo types take other steps.
  GroupShape mars{
      {"exp_avg", "exp_avg_sq", "last_grad"},
      {"lr", "lr_1d", "lr_1d_factor", "betas", "betas_1d", "gamma", "optimize_1d", "weight_decay",
       "weight_decay_1d", "weight_decouple", "fixed_decay", "eps", "step", "mars_type"},
      {"gamma", "mars_type", "lr_1d_factor"},
      {{"ams_bound", false}, {"cautious", false}},
      false,
      {},
      {{"mars_type", "adamw"}}};
  // Schedule-Free AdamW's groups carry its step count (k), the running weight sum and lr_max.
  const std::vector<std::string> schedulefree_reads = {
      "lr",         "betas",  "eps", "weight_decay", "warmup_steps", "r", "weight_lr_power",
      "weight_sum", "lr_max", "k",   "scheduled_lr"};
  GroupShape schedulefree_train{{"z", "exp_avg_sq"},
                                schedulefree_reads,
                                {"weight_sum", "lr_max", "train_mode"},
                                {{"train_mode", true}}};
  GroupShape schedulefree_eval{{"z", "exp_avg_sq"},
                               schedulefree_reads,
                               {"weight_sum", "lr_max", "train_mode"},
                               {{"train_mode", false}}};
  // One statistic and inverse root per dimension: pre_cond_0, inv_pre_cond_0 for every
  // parameter, more for tensors of more dimensions.
  GroupShape shampoo{
      {"pre_cond_0", "inv_pre_cond_0"},
      {"lr", "momentum", "weight_decay", "weight_decouple", "fixed_decay", "matrix_eps", "step"},
      {"matrix_eps"},
      {},
      false,
      {"momentum_buffer", "pre_cond_1", "inv_pre_cond_1", "pre_cond_2", "inv_pre_cond_2",
       "pre_cond_3", "inv_pre_cond_3"}};
  // Kron: its factors Q (one per dimension) and their einsum expressions (strings, rebuilt from
  // the shape); only the first group counts the steps since the last fit (update_counter).
  GroupShape kron{
      {"momentum_buffer", "Q", "expressions"},
      {"lr", "momentum", "weight_decay", "weight_decouple", "pre_conditioner_update_probability",
       "max_size_triangular", "min_ndim_triangular", "memory_save_mode",
       "momentum_into_precondition_update", "precondition_lr", "precondition_init_scale",
       "mu_dtype", "precondition_dtype", "step", "update_counter"},
      {"pre_conditioner_update_probability", "precondition_lr", "precondition_init_scale"},
      {}};
  // Adam-mini: one group per parameter, named; its block decides the state beside m.
  GroupShape adam_mini{{"m"},
                       {"lr", "beta1", "beta2", "eps", "weight_decay", "name"},
                       {"name", "beta1", "beta2"},
                       {},
                       false,
                       {"v", "vmean", "head_per_gpu", "neuron_per_gpu", "reduced", "block_numel"}};
  GroupShape scion{{"d"},
                   {"lr", "momentum", "constraint", "norm_type", "norm_kwargs", "scale",
                    "weight_decay", "weight_decouple", "step"},
                   {"norm_type", "norm_kwargs", "constraint"},
                   {}};
  return std::vector<Rule>{
      {"ademamix", "pytorch-optimizer's AdEMAMix", {ademamix}, ""},
      {"scion", "pytorch-optimizer's SCION", {scion}, ""},
      {"adam-mini", "adam-mini's Adam_mini", {adam_mini}, ""},
      {"kron", "pytorch-optimizer's Kron (PSGD)", {kron}, ""},
      {"soap", "pytorch-optimizer's SOAP", {soap}, ""},
      {"shampoo", "pytorch-optimizer's Shampoo", {shampoo}, ""},
      {"adamuon", "pytorch-optimizer's AdaMuon", {adamuon_muon, adamuon_adam}, ""},
      {"mars", "pytorch-optimizer's MARS (mars_type adamw)", {mars}, ""},
      {"adamw-schedulefree",
       "schedulefree's AdamWScheduleFree in train mode: parameters y, the step audited is y's",
       {schedulefree_train},
       ""},
      {"adamw-schedulefree",
       "schedulefree's AdamWScheduleFree in eval mode",
       {schedulefree_eval},
       "saved in eval mode (train_mode False): its parameters are the average x, not the point "
       "y where its gradient is taken and which its step moves; save it after "
       "optimizer.train(), or audit it along delta"},
  };
}

const std::vector<Rule>& rules() {
  static const std::vector<Rule> table = [] {
    std::vector<Rule> all = torch_rules();
    for (auto& rule : package_rules()) all.push_back(std::move(rule));
    return all;
  }();
  return table;
}

bool contains(const std::vector<std::string>& v, const std::string& key) {
  return std::find(v.begin(), v.end(), key) != v.end();
}

const char* python_bool(bool b) { return b ? "True" : "False"; }

using curv::join;
std::string join(const std::set<std::string>& parts, const std::string& separator) {
  return curv::join(std::vector<std::string>(parts.begin(), parts.end()), separator);
}

// How `group` differs from `shape` ("" when it fits), ignoring markers.
std::string misfit(const GroupKeys& group, const GroupShape& shape) {
  std::vector<std::string> excess, wrong, lacking, extra_state;
  for (const auto& key : group.keys) {
    const bool flag = std::any_of(shape.flags.begin(), shape.flags.end(),
                                  [&](const auto& f) { return f.first == key; }) ||
                      key == kNotMaximize.first;
    if (!flag && !contains(shape.reads, key) && !contains(shape.markers, key) &&
        !contains(kIgnored, key)) {
      excess.push_back(key);
    }
  }
  auto check_flag = [&](const std::pair<std::string, bool>& f) {
    const auto it = group.flags.find(f.first);
    if (group.keys.count(f.first) && (it == group.flags.end() || it->second != f.second)) {
      wrong.push_back(fmt::format("{} is not {}", f.first, python_bool(f.second)));
    }
  };
  for (const auto& f : shape.flags) check_flag(f);
  check_flag(kNotMaximize);
  for (const auto& [key, want] : shape.texts) {
    const auto it = group.texts.find(key);
    if (group.keys.count(key) && (it == group.texts.end() || it->second != want)) {
      wrong.push_back(fmt::format("{} is not '{}'", key, want));
    }
  }
  for (const auto& key : group.state) {
    if (!contains(shape.state, key) && !contains(shape.optional_state, key)) {
      extra_state.push_back(key);
    }
  }
  if (!group.state.empty()) {
    for (const auto& key : shape.state) {
      if (!group.state.count(key)) lacking.push_back(key);
    }
  }
  std::vector<std::string> parts;
  if (!extra_state.empty()) parts.push_back("state has " + join(extra_state, ", ") + " in excess");
  if (!lacking.empty()) parts.push_back("state lacks " + join(lacking, ", "));
  if (!excess.empty()) parts.push_back("param_groups have " + join(excess, ", ") + " in excess");
  if (!wrong.empty()) parts.push_back(join(wrong, ", "));
  return join(parts, "; ");
}

// Whether `group` records every marker of `shape` (with the flag value the shape accepts).
bool marked(const GroupKeys& group, const GroupShape& shape) {
  return std::all_of(shape.markers.begin(), shape.markers.end(),
                     [&](const std::string& key) { return group.keys.count(key) > 0; });
}

struct Fit {
  const Rule* rule = nullptr;
  std::string misfit;       // "" when every group fits a shape
  bool marked = false;      // every group fits a shape whose markers it records
  std::vector<bool> ortho;  // per group, from the shape it fits
};

Fit fit(const Rule& rule, const OptimizerKeys& keys) {
  Fit f;
  f.rule = &rule;
  f.marked = !rule.named_only;
  for (size_t g = 0; g < keys.groups.size(); ++g) {
    std::string first_misfit;
    bool fits = false, is_marked = false, ortho = false;
    for (const auto& shape : rule.shapes) {
      const std::string why = misfit(keys.groups[g], shape);
      if (!why.empty()) {
        if (first_misfit.empty()) first_misfit = why;
        continue;
      }
      if (!fits || (!is_marked && marked(keys.groups[g], shape))) ortho = shape.orthogonalised;
      fits = true;
      is_marked = is_marked || marked(keys.groups[g], shape);
    }
    if (!fits) {
      f.misfit =
          keys.groups.size() > 1 ? fmt::format("group {}: {}", g, first_misfit) : first_misfit;
      f.marked = false;
      return f;
    }
    f.marked = f.marked && is_marked;
    f.ortho.push_back(ortho);
  }
  return f;
}

// "state exp_avg, exp_avg_sq; param_groups amsgrad=False, decoupled_weight_decay=True": what the
// recognised state records, for the output's recognition line.
std::string evidence(const OptimizerKeys& keys) {
  std::set<std::string> state, group_keys;
  for (const auto& g : keys.groups) {
    state.insert(g.state.begin(), g.state.end());
    for (const auto& key : g.keys) {
      if (contains(kIgnored, key)) continue;
      const auto flag = g.flags.find(key);
      group_keys.insert(flag == g.flags.end() ? key : key + "=" + python_bool(flag->second));
    }
  }
  return fmt::format("state {}; param_groups {}", state.empty() ? "(none yet)" : join(state, ", "),
                     join(group_keys, ", "));
}

bool all_without_decay(const OptimizerKeys& keys) {
  return std::all_of(keys.groups.begin(), keys.groups.end(),
                     [](const GroupKeys& g) { return g.weight_decay.value_or(1) == 0; });
}

Recognition accepted(const Fit& f, const std::string& origin, std::string how) {
  Recognition r;
  if (!f.rule->refusal.empty()) {
    r.refusal = origin + ": " + f.rule->refusal;
    r.writer = f.rule->writer;
    r.how = std::move(how);
    return r;
  }
  r.rule = f.rule->name;
  r.writer = f.rule->writer;
  r.how = std::move(how);
  r.orthogonalised = f.ortho;
  return r;
}

std::string names_of(const std::vector<Fit>& fits) {
  std::vector<std::string> names;
  for (const auto& f : fits) names.push_back(fmt::format("{} ({})", f.rule->name, f.rule->writer));
  return join(names, ", ");
}

// "the optimizer sgd or muon": each rule name once, in table order. A refusal is a record kept in
// files and read by every program, so it names the option in words, not by a tool's flag.
std::string choices_of(const std::vector<Fit>& fits) {
  std::vector<std::string> names;
  for (const auto& f : fits) {
    if (f.rule->refusal.empty() && !contains(names, f.rule->name)) names.push_back(f.rule->name);
  }
  return "the optimizer " + join(names, " or ");
}

Recognition refused(std::string text) {
  Recognition r;
  r.refusal = std::move(text);
  return r;
}

Recognition named_rule(const OptimizerKeys& keys, const std::string& origin,
                       const std::string& named) {
  std::vector<std::string> misfits, known;
  std::vector<Fit> fits;
  for (const auto& rule : rules()) {
    if (!contains(known, rule.name)) known.push_back(rule.name);
    if (rule.name != named) continue;
    Fit f = fit(rule, keys);
    if (f.misfit.empty()) {
      fits.push_back(f);
    } else {
      misfits.push_back(fmt::format("{}: {}", rule.writer, f.misfit));
    }
  }
  // Of the writers of that name the state fits: one whose markers it records, else one that has
  // none to record (Keller Jordan's plain Muon rather than MuonWithAuxAdam without use_muon).
  for (const auto prefer :
       {+[](const Fit& f) { return f.marked; }, +[](const Fit& f) { return f.rule->named_only; },
        +[](const Fit&) { return true; }}) {
    for (const auto& f : fits) {
      if (prefer(f)) return accepted(f, origin, fmt::format("named by the user ({})", named));
    }
  }
  if (misfits.empty()) {
    return refused(fmt::format(
        "{}: optimizer '{}': no rule of that name reads torch optimizer states; rules: {}", origin,
        named, join(known, ", ")));
  }
  return refused(
      fmt::format("{}: optimizer state is not {}'s: {}", origin, named, join(misfits, "; ")));
}

}  // namespace

std::vector<std::string> rule_lines() {
  std::vector<std::string> lines;
  for (const auto& rule : rules()) {
    // One entry per key; Shampoo's per-dimension keys (pre_cond_0, pre_cond_1, ...) as pre_cond_k.
    std::vector<std::string> state;
    for (const auto& shape : rule.shapes) {
      for (const auto& keys : {shape.state, shape.optional_state}) {
        for (std::string key : keys) {
          const auto digits = key.find_last_not_of("0123456789");
          if (digits + 1 < key.size() && key[digits] == '_') key = key.substr(0, digits + 1) + "k";
          if (!contains(state, key)) state.push_back(key);
        }
      }
    }
    lines.push_back(fmt::format("{} ({}): {}{}", rule.name, rule.writer,
                                state.empty() ? "no state" : join(state, ", "),
                                rule.refusal.empty() ? "" : " (refused: not rebuilt)"));
  }
  return lines;
}

Recognition recognise_optimizer(const OptimizerKeys& keys, const std::string& origin,
                                const std::string& named) {
  if (!named.empty()) return named_rule(keys, origin, named);
  std::vector<Fit> fitting, marked_fits;
  std::vector<std::string> tried;
  for (const auto& rule : rules()) {
    Fit f = fit(rule, keys);
    if (!f.misfit.empty()) {
      tried.push_back(fmt::format("{} ({}): {}", rule.name, rule.writer, f.misfit));
      continue;
    }
    (f.marked ? marked_fits : fitting).push_back(f);
  }
  const std::string seen = evidence(keys);
  if (marked_fits.size() == 1) {
    return accepted(marked_fits[0], origin, "recognised by keys: " + seen);
  }
  if (marked_fits.size() > 1) {
    return refused(fmt::format("{}: optimizer state fits {} alike ({}); name one: {}", origin,
                               names_of(marked_fits), seen, choices_of(marked_fits)));
  }
  if (fitting.empty()) {
    std::set<std::string> unknown;
    for (const auto& g : keys.groups) {
      for (const auto& key : g.state) {
        const bool known = std::any_of(rules().begin(), rules().end(), [&](const Rule& r) {
          return std::any_of(r.shapes.begin(), r.shapes.end(), [&](const GroupShape& s) {
            return contains(s.state, key) || contains(s.optional_state, key);
          });
        });
        if (!known) unknown.insert(key);
      }
    }
    return refused(fmt::format(
        "{}: optimizer state fits no rule libcurv rebuilds{}; tried {}; audit it along delta, "
        "or name the optimizer that wrote it",
        origin, unknown.empty() ? "" : " (state keys " + join(unknown, ", ") + " unknown to all)",
        join(tried, "; ")));
  }
  // Rules that fit, none recording its markers.
  const auto is = [&](const char* a, const char* b) {
    return fitting.size() == 2 && fitting[0].rule->name == a && fitting[1].rule->name == b;
  };
  if (is("adamw", "adam")) {
    if (keys.implied_rule == "adamw") {
      return accepted(
          fitting[0], origin,
          fmt::format("recognised by keys: {}; Adam or AdamW: {}", seen, keys.implied_by));
    }
    if (all_without_decay(keys)) {
      return accepted(fitting[0], origin,
                      fmt::format("recognised by keys: {}; Adam and AdamW take the same step "
                                  "at weight_decay 0",
                                  seen));
    }
    return refused(fmt::format(
        "{}: optimizer state is torch.optim.Adam's or AdamW's, which differ by their weight "
        "decay, and its param_groups do not record decoupled_weight_decay (torch < 2.7); name "
        "it: the optimizer adamw (decoupled decay) or adam (L2 decay in the gradient)",
        origin));
  }
  return refused(
      fmt::format("{}: optimizer state fits {} alike, and records none of their markers ({}); "
                  "name one: {}",
                  origin, names_of(fitting), seen, choices_of(fitting)));
}

}  // namespace curv::torch_state
