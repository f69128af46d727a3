// Optimizer parameter order: the rules that name a torch optimizer's indices after the model's
// parameters, auto's choice among them, and the resolved state written into the checkpoint.
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <stdexcept>

#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/io/checkpoint.h"
#include "io/fused_experts.h"
#include "io/param_order_rules.h"

namespace curv {

namespace {

namespace fs = std::filesystem;

struct ParamOrderName {
  ParamOrder order;
  const char* name;
};
// The rules a user may name, in the order messages list them; "file:" takes a path after it.
constexpr ParamOrderName kParamOrders[] = {
    {ParamOrder::kAuto, "auto"},     {ParamOrder::kModel, "model"},
    {ParamOrder::kNdim, "ndim"},     {ParamOrder::kHidden, "hidden"},
    {ParamOrder::kModded, "modded"}, {ParamOrder::kTrainer, "trainer"},
    {ParamOrder::kFile, "file:"}};
// The rules auto tries when no names were recorded, from least to most specific.
constexpr ParamOrder kGuessed[] = {ParamOrder::kModel, ParamOrder::kNdim, ParamOrder::kHidden};

// The option as messages name it: the rule a user gave (ProbeRunOptions.param_order, the
// Python package's param_order=), which tools write as their flag.
constexpr const char* kOption = "ParamOrderSpec";

InvalidOption unknown_param_order(const std::string& text) {
  std::vector<std::string> names = param_order_choices();
  const std::string last = names.back();
  names.pop_back();
  return InvalidOption(
      "{0}: " + InvalidOption::literal(fmt::format("expected {} or {}", join(names, ", "), last)),
      {{kOption, "'" + InvalidOption::literal(text) + "'"}});
}

std::string count_problem(const OrderInput& in, size_t expected, const char* what) {
  return fmt::format("the optimizer has {} parameters, {} {}", in.indices.size(), what, expected);
}

// The shape the state tensor `key` has for a parameter of `shape`: the parameter's own, or that of
// the statistics some rules keep (NAdam's scalar mu_product, AdaMuon's flat v, Adafactor's row and
// column moments,
// SOAP's Kronecker factors GG.k and eigenbases Q.k, Shampoo's pre_cond_k and inv_pre_cond_k;
// docs/optimizers.md).
std::vector<int64_t> state_shape(const std::string& key, std::vector<int64_t> shape) {
  if (key == "mu_product") return {};
  if (key == "v") {  // AdaMuon's second moment of the flattened matrix
    int64_t numel = 1;
    for (int64_t n : shape) numel *= n;
    return {numel};
  }
  if (key == "row_var" && !shape.empty()) shape.back() = 1;
  if (key == "col_var" && shape.size() >= 2) shape[shape.size() - 2] = 1;
  for (const char* factor : {"GG.", "Q.", "pre_cond_", "inv_pre_cond_"}) {
    const std::string prefix = factor;
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string index = key.substr(prefix.size());
    if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) continue;
    const size_t k = std::stoul(index);
    if (k < shape.size()) return {shape[k], shape[k]};
  }
  return shape;
}

// The shapes of state that only its rule can tell from the parameter's: Kron's diagonal factor
// (Q.k a vector of the parameter's k-th size, where SOAP's is square), and Adam-mini's first
// moment of a query or key block viewed per head (m: the same entries, rows of head_numel) and
// second moments (vmean: a scalar, or one per row or head).
bool rule_shape(const std::string& key, const std::vector<int64_t>& shape,
                const std::vector<int64_t>& param) {
  int64_t numel = 1, param_numel = 1;
  for (int64_t n : shape) numel *= n;
  for (int64_t n : param) param_numel *= n;
  if (key == "m") return shape.size() == 2 && numel == param_numel;
  if (key == "vmean") return shape.empty() || (shape.size() == 2 && shape[1] == 1);
  if (key.rfind("Q.", 0) != 0 || shape.size() != 1) return false;
  const std::string index = key.substr(2);
  if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) return false;
  const size_t k = std::stoul(index);
  return k < param.size() && shape[0] == param[k];
}

std::string check_shapes(const IndexedOptimizerState& ix, const ParamSpace& space,
                         const std::vector<int64_t>& indices, const std::vector<size_t>& params) {
  for (size_t k = 0; k < indices.size(); ++k) {
    auto it = ix.state.find(indices[k]);
    if (it == ix.state.end()) continue;
    const auto& p = space[params[k]];
    for (const auto& [key, t] : it->second) {
      const auto want = state_shape(key, p.shape);
      if (t.sizes().vec() != want && !rule_shape(key, t.sizes().vec(), p.shape)) {
        // modded-nanogpt's merged state: the key in the file is that of one of the two optimizers.
        const std::string where =
            !ix.modded ? fmt::format("state[{}]", indices[k])
            : indices[k] < ix.muon_offset
                ? fmt::format("[0] (AdamW) state[{}]", indices[k])
                : fmt::format("[1] (Muon) state[{}]", indices[k] - ix.muon_offset);
        const std::string slot = ix.modded && key == "momentum_buffer" ? "momentum" : key;
        return fmt::format("{}.{} has shape {}, but parameter '{}' has shape {}{}", where, slot,
                           shape_string(t.sizes().vec()), p.name, shape_string(p.shape),
                           want == p.shape ? "" : " (the state needs " + shape_string(want) + ")");
      }
    }
  }
  return "";
}

std::string regex_escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

std::vector<std::string> read_order_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw InvalidOption("{0}: the file cannot be opened",
                        {{kOption, "file:" + InvalidOption::literal(path)}});
  }
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  return names;
}

ParamMapping by_model_order(const OrderInput& in) {
  ParamMapping m{param_order_name(ParamOrder::kModel), {}, ""};
  if (in.indices.size() != in.space.size()) {
    m.problem = count_problem(in, in.space.size(), "the model");
    return m;
  }
  for (size_t i = 0; i < in.indices.size(); ++i) m.of_index.push_back(i);
  return m;
}

// Muon's split: the matrices it orthogonalises by default, then the rest, in any groups.
ParamMapping by_hidden_first(const OrderInput& in) {
  ParamMapping m{param_order_name(ParamOrder::kHidden), {}, ""};
  if (in.indices.size() != in.space.size()) {
    m.problem = count_problem(in, in.space.size(), "the model");
    return m;
  }
  for (size_t i = 0; i < in.space.size(); ++i) {
    if (is_hidden_matrix(in.space[i])) m.of_index.push_back(i);
  }
  // The orthogonalised matrices fill whole groups.
  size_t boundary = 0;
  bool aligned = m.of_index.empty();
  for (const auto& g : in.ix.groups) {
    boundary += g.params.size();
    aligned = aligned || boundary == m.of_index.size();
  }
  if (!aligned) {
    m.problem = fmt::format(
        "its groups hold {} parameters, which do not start with the "
        "model's {} hidden matrices",
        group_sizes(in.ix), m.of_index.size());
    m.of_index.clear();
    return m;
  }
  for (size_t i = 0; i < in.space.size(); ++i) {
    if (!is_hidden_matrix(in.space[i])) m.of_index.push_back(i);
  }
  return m;
}

ParamMapping by_ndim_groups(const OrderInput& in) {
  return two_groups(
      in, ParamOrder::kNdim, [&](size_t i) { return in.space[i].shape.size() >= 2; },
      [](size_t matrices, size_t rest) {
        return fmt::format("the model has {} with ndim >= 2 and {} others", matrices, rest);
      });
}

// Names in index order: those the optimizer recorded (`order_file` empty) or an order file's.
ParamMapping by_listed_names(const OrderInput& in, const std::string& order_file) {
  const bool recorded = order_file.empty();
  ParamMapping m{recorded ? param_order_name(ParamOrder::kNames) : "file:" + order_file, {}, ""};
  const std::string path = recorded ? in.ix.origin + " param_names" : order_file;
  std::vector<std::string> names;
  if (recorded) {
    for (const auto& g : in.ix.groups) names.insert(names.end(), g.names.begin(), g.names.end());
  } else {
    names = read_order_file(path);
  }
  if (names.size() != in.indices.size()) {
    throw InvalidOption(
        fmt::format("{}: {{0}} lists {} names for the optimizer's {} parameters",
                    InvalidOption::literal(in.ix.origin), names.size(), in.indices.size()),
        {{kOption, recorded ? "names" : "file:" + InvalidOption::literal(path)}});
  }
  const auto model_names = in.space.names();
  for (const auto& name : names) {
    auto index = in.space.find(name);
    if (!index) {
      if (recorded) {
        throw InvalidArgument(fmt::format("{}: '{}' is not a model parameter{}", path, name,
                                          did_you_mean(name, model_names)));
      }
      throw InvalidOption(
          "{0}: " + InvalidOption::literal(fmt::format("'{}' is not a model parameter{}", name,
                                                       did_you_mean(name, model_names))),
          {{kOption, "file:" + InvalidOption::literal(path)}});
    }
    m.of_index.push_back(*index);
  }
  return m;
}

// One rule's mapping, its problem including any state tensor whose shape does not fit.
ParamMapping map_by(const OrderInput& in, ParamOrder order, const std::string& order_file = "") {
  ParamMapping m;
  switch (order) {
    case ParamOrder::kModel:
      m = by_model_order(in);
      break;
    case ParamOrder::kNdim:
      m = by_ndim_groups(in);
      break;
    case ParamOrder::kHidden:
      m = by_hidden_first(in);
      break;
    case ParamOrder::kModded:
      m = by_modded_groups(in);
      break;
    case ParamOrder::kTrainer:
      m = by_trainer_groups(in);
      break;
    case ParamOrder::kFile:
      m = by_listed_names(in, order_file);
      break;
    case ParamOrder::kNames:
      m = by_listed_names(in, "");
      break;
    case ParamOrder::kAuto:
      throw unknown_param_order("auto");  // resolved by choose_auto
  }
  if (!m.problem.empty()) return m;
  std::vector<size_t> params(m.of_index.begin(), m.of_index.end());
  m.problem = check_shapes(in.ix, in.space, in.indices, params);
  return m;
}

// auto without recorded names: the rules whose group sizes and state shapes fit; an error when
// none does, or when several do and name the parameters differently.
ParamMapping choose_guessed(const OrderInput& in) {
  std::vector<ParamMapping> fits, misfits;
  for (ParamOrder order : kGuessed) {
    auto m = map_by(in, order);
    (m.problem.empty() ? fits : misfits).push_back(std::move(m));
  }
  if (fits.empty()) {
    std::vector<std::string> why;
    for (const auto& m : misfits) why.push_back(m.rule + ": " + m.problem);
    throw InvalidOption(
        InvalidOption::literal(fmt::format("{}: optimizer state does not fit the model's "
                                           "parameters in any known order ({}); it is for a "
                                           "different model, or give ",
                                           in.ix.origin, join(why, "; "))) +
            "{0} listing the names in optimizer order",
        {{kOption, "file:PATH"}});
  }
  // Rules that fit but map some index differently leave the names undecided, unless there is
  // no state at all (then only the group hyper-parameters depend on the order).
  std::vector<std::string> disagreeing = {fits[0].rule};
  for (size_t i = 1; i < fits.size(); ++i) {
    if (fits[i].of_index != fits[0].of_index) disagreeing.push_back(fits[i].rule);
  }
  if (disagreeing.size() > 1 && !in.ix.state.empty()) {
    throw InvalidOption(
        InvalidOption::literal(fmt::format(
            "{}: optimizer parameter order is ambiguous: the group sizes and state shapes fit the "
            "rules {}, which name the parameters differently; give ",
            in.ix.origin, join(disagreeing, ", "))) +
            "{0} as one of them or file:PATH",
        {{kOption, ""}});
  }
  // Without state, a grouping rule (ndim, hidden) is the more specific claim than model order.
  return fits.back();
}

ParamMapping choose_mapping(const OrderInput& in, const ParamOrderSpec& spec) {
  if (spec.order != ParamOrder::kAuto) {
    ParamMapping m = map_by(in, spec.order, spec.path);
    if (!m.problem.empty()) {
      throw InvalidOption(InvalidOption::literal(in.ix.origin) +
                              ": {0} does not fit the model: " + InvalidOption::literal(m.problem),
                          {{kOption, InvalidOption::literal(spec.text())}});
    }
    return m;
  }
  // The writing program's own order, where no other can name the state (modded-nanogpt's).
  const auto& writer = in.ix.writer_rule;
  if (writer && writer->required) {
    ParamMapping m = map_by(in, writer->order);
    if (!m.problem.empty()) {
      throw InvalidOption(
          InvalidOption::literal(fmt::format("{}: optimizer state does not fit the model as {} "
                                             "orders it (",
                                             in.ix.origin, writer->writer)) +
              "{0}): " + InvalidOption::literal(m.problem),
          {{kOption, param_order_name(writer->order)}});
    }
    return m;
  }
  const auto& groups = in.ix.groups;
  const bool names_recorded =
      !groups.empty() && std::all_of(groups.begin(), groups.end(), [](const auto& g) {
        return g.names.size() == g.params.size() && !g.params.empty();
      });
  if (!names_recorded) {
    // The writing program's grouping, when it fits (a Trainer's optimizer.pt).
    if (writer) {
      ParamMapping m = map_by(in, writer->order);
      if (m.problem.empty()) return m;
    }
    return choose_guessed(in);
  }
  // The optimizer saved its parameters' names: no order needs to be guessed.
  ParamMapping m = map_by(in, ParamOrder::kNames);
  if (!m.problem.empty()) {
    throw InvalidArgument(
        fmt::format("{}: optimizer state does not fit the model: {}", in.ix.origin, m.problem));
  }
  return m;
}

// Names the state tensors and records the groups, the rule and Muon's partition in the meta.
// `fused`: `in.space` is the training program's parameters with fused experts, whose state is
// split into the model's parameters (elementwise state only).
void apply_mapping(Checkpoint& ckpt, const OrderInput& in, const ParamMapping& chosen,
                   const ParamSpace& model, const FusedExpertSpace* fused) {
  const auto& ix = in.ix;
  const auto& space = in.space;
  NamedTensors named;
  std::vector<TensorSlice> stored;  // "<param>.<key>" → its box in ix.source
  std::map<int64_t, size_t> param_of;
  for (size_t k = 0; k < in.indices.size(); ++k) param_of[in.indices[k]] = chosen.of_index[k];
  auto parts_of = [&](size_t p) {
    return fused ? fused->parts[p] : std::vector<RuntimePart>{{p, -1, 0}};
  };
  // Split fused state is read through slices, of the files where the state was left there (a
  // sharded save) or else of the tensors read, held under "<index>.<key>".
  std::vector<std::pair<std::string, at::Tensor>> held;
  for (const auto& [index, tensors] : ix.state) {
    const size_t p = param_of.at(index);
    for (const auto& [key, t] : tensors) {
      const auto where = ix.stored_as.find({index, key});
      if (!fused) {
        if (where != ix.stored_as.end()) {
          stored.push_back({space[p].name + "." + key, where->second, {}, {}});
        } else {
          named.emplace_back(space[p].name + "." + key, t);
        }
        continue;
      }
      std::string in_base = fmt::format("{}.{}", index, key);
      if (where != ix.stored_as.end()) {
        in_base = where->second;
      } else {
        held.emplace_back(in_base, t);
      }
      for (const RuntimePart& part : parts_of(p)) {
        const ParamInfo& param = model[part.param];
        const std::string name = param.name + "." + key;
        if (part.expert < 0 || t.dim() == 0) {  // whole, or a scalar each expert shares
          stored.push_back({name, in_base, {}, {}});
          continue;
        }
        if (t.sizes().vec() != space[p].shape) {
          throw InvalidArgument(fmt::format(
              "{}: state[{}].{} of the fused '{}' has shape {}, not the tensor's {}: it does not "
              "split into the experts' parameters",
              ix.origin, index, key, space[p].name, shape_string(t.sizes().vec()),
              shape_string(space[p].shape)));
        }
        stored.push_back({name, in_base, {part.expert, part.row_offset, 0}, param.shape});
      }
    }
  }
  // A reader leaves all of a state's tensors in its files or none (optimizer_dict, DCP).
  if ((!held.empty() && !ix.stored_as.empty()) || (!stored.empty() && !named.empty())) {
    throw std::logic_error(ix.origin + ": optimizer state partly read and partly left in files");
  }
  if (!ckpt.meta.optimizer) ckpt.meta.optimizer.emplace();
  OptimizerRecord& record = *ckpt.meta.optimizer;
  record.param_groups.clear();
  // MuonWithAuxAdam's groups say which parameters it orthogonalises: exactly those names.
  std::vector<std::string> orthogonalised;
  size_t k = 0;
  for (const auto& g : ix.groups) {
    OptimizerParamGroup group;
    for (const auto& [key, value] : g.hyper.items())
      group.hyper.emplace_back(key, value.get<double>());
    for (size_t i = 0; i < g.params.size(); ++i, ++k) {
      for (const RuntimePart& part : parts_of(chosen.of_index[k])) {
        const std::string& name = model[part.param].name;
        group.params.push_back(name);
        if (g.use_muon.value_or(false)) orthogonalised.push_back(regex_escaped(name));
      }
    }
    record.param_groups.push_back(std::move(group));
  }
  record.param_order = chosen.rule;
  if (ix.muon_params) {
    record.muon_params = ix.muon_params;
  } else if (!orthogonalised.empty()) {
    record.muon_params = "^(" + join(orthogonalised, "|") + ")$";
  }
  ckpt.optimizer = std::move(named);
  ckpt.optimizer_source =
      stored.empty()
          ? nullptr
          : sliced_tensor_source(
                held.empty() ? ix.source : memory_tensor_source(std::move(held), ix.origin),
                std::move(stored));
  ckpt.indexed_optimizer.reset();
}

// A rule whose step on a fused expert tensor is not its experts' steps side by side is refused.
void check_splits_into_experts(const Checkpoint& ckpt) {
  const std::string rule = ckpt.meta.optimizer ? ckpt.meta.optimizer->name : "";
  if (rule.empty() || splits_into_experts(rule)) return;
  throw InvalidArgument(fmt::format(
      "{}: the state is over each layer's experts fused into two tensors (transformers 5's "
      "experts.gate_up_proj and experts.down_proj), and {}'s step on a fused tensor is not "
      "elementwise, so it does not split into the experts' parameters",
      ckpt.indexed_optimizer->origin, rule));
}

}  // namespace

std::string param_order_name(ParamOrder order) {
  if (order == ParamOrder::kNames) return "names";
  for (const auto& entry : kParamOrders) {
    if (entry.order == order) return entry.name;
  }
  return "?";
}

std::vector<std::string> param_order_choices() {
  std::vector<std::string> names;
  for (const auto& entry : kParamOrders) {
    names.push_back(entry.order == ParamOrder::kFile ? "file:PATH" : entry.name);
  }
  return names;
}

std::string ParamOrderSpec::text() const {
  return order == ParamOrder::kFile ? param_order_name(order) + path : param_order_name(order);
}

ParamOrderSpec parse_param_order(const std::string& text) {
  for (const auto& entry : kParamOrders) {
    if (entry.order == ParamOrder::kFile && text.rfind(entry.name, 0) == 0) {
      return {entry.order, text.substr(std::string(entry.name).size())};
    }
    if (text == entry.name) return {entry.order, ""};
  }
  throw unknown_param_order(text);
}

std::string group_sizes(const IndexedOptimizerState& ix) {
  std::vector<std::string> sizes;
  for (const auto& g : ix.groups) sizes.push_back(std::to_string(g.params.size()));
  return join(sizes, " + ");
}

void validate_param_order(const ParamOrderSpec& spec) {
  if (spec.order == ParamOrder::kNames) {
    throw InvalidOption("{0} is chosen by auto, never named", {{kOption, "names"}});
  }
  if (spec.order == ParamOrder::kFile && !fs::is_regular_file(spec.path)) {
    throw InvalidOption("{0}: no such file", {{kOption, InvalidOption::literal(spec.text())}});
  }
}

void resolve_optimizer_state(Checkpoint& ckpt, const ParamSpace& space,
                             const ParamOrderSpec& param_order, const ModelStructure* structure) {
  validate_param_order(param_order);
  if (!ckpt.indexed_optimizer) return;
  if (!ckpt.indexed_optimizer->problem.empty()) {
    throw InvalidArgument(ckpt.indexed_optimizer->problem);
  }
  std::vector<int64_t> indices;
  for (const auto& g : ckpt.indexed_optimizer->groups) {
    indices.insert(indices.end(), g.params.begin(), g.params.end());
  }
  if (structure && indices.size() != space.size()) {
    // A state over experts fused as transformers 5 holds them: named after the fused tensors, its
    // router before or after them, then split into the model's per-expert parameters.
    std::exception_ptr first_error;
    for (const RouterPlacement router :
         {RouterPlacement::kBeforeExperts, RouterPlacement::kAfterExperts}) {
      const auto fused = fused_expert_space(space, *structure, router);
      if (!fused || fused->space.size() != indices.size()) break;
      OrderInput in{*ckpt.indexed_optimizer, fused->space, indices, &fused->structure};
      ParamMapping chosen;
      try {
        chosen = choose_mapping(in, param_order);
      } catch (const std::exception&) {
        if (!first_error) first_error = std::current_exception();
        continue;
      }
      check_splits_into_experts(ckpt);
      apply_mapping(ckpt, in, chosen, space, &*fused);
      return;
    }
    if (first_error) std::rethrow_exception(first_error);
  }
  OrderInput in{*ckpt.indexed_optimizer, space, std::move(indices), structure};
  apply_mapping(ckpt, in, choose_mapping(in, param_order), space, nullptr);
}

void resolve_optimizer_state(Checkpoint& ckpt, const ParamSpace& space,
                             const std::string& param_order, const ModelStructure* structure) {
  resolve_optimizer_state(ckpt, space, parse_param_order(param_order), structure);
}

}  // namespace curv
