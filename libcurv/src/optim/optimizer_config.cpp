// OptimizerConfig: an optimizer's hyperparameters as the "name:key=value,..." spec, the stored
// JSON and the fields every optimizer entry reads (validated against the entry's key list).
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>

#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/optim/optimizers.h"

namespace curv {

OptimizerConfig OptimizerConfig::defaults(const std::string& name) {
  return optimizer_entry(name).defaults;
}

namespace {

struct Field {
  const char* name;
  double OptimizerConfig::*number = nullptr;
  bool OptimizerConfig::*flag = nullptr;
  int64_t OptimizerConfig::*integer = nullptr;
};

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      {"lr", &OptimizerConfig::lr},
      {"weight_decay", &OptimizerConfig::weight_decay},
      {"beta1", &OptimizerConfig::beta1},
      {"beta2", &OptimizerConfig::beta2},
      {"eps", &OptimizerConfig::eps},
      {"momentum", &OptimizerConfig::momentum},
      {"dampening", &OptimizerConfig::dampening},
      {"nesterov", nullptr, &OptimizerConfig::nesterov},
      {"sum_momentum", nullptr, &OptimizerConfig::sum_momentum},
      {"rms_scale", nullptr, &OptimizerConfig::rms_scale},
      {"ns_steps", nullptr, nullptr, &OptimizerConfig::ns_steps},
      {"ns_a", &OptimizerConfig::ns_a},
      {"ns_b", &OptimizerConfig::ns_b},
      {"ns_c", &OptimizerConfig::ns_c},
      {"exact_polar", nullptr, &OptimizerConfig::exact_polar},
      {"adam_lr", &OptimizerConfig::adam_lr},
      {"adam_beta1", &OptimizerConfig::adam_beta1},
      {"adam_beta2", &OptimizerConfig::adam_beta2},
      {"adam_eps", &OptimizerConfig::adam_eps},
      {"adam_weight_decay", &OptimizerConfig::adam_weight_decay},
      {"adjust_lr", nullptr, nullptr, &OptimizerConfig::adjust_lr},
      {"decoupled", nullptr, &OptimizerConfig::decoupled},
      {"momentum_decay", &OptimizerConfig::momentum_decay},
      {"beta2_decay", &OptimizerConfig::beta2_decay},
      {"eps2", &OptimizerConfig::eps2},
      {"clip_threshold", &OptimizerConfig::clip_threshold},
      {"beta3", &OptimizerConfig::beta3},
      {"alpha", &OptimizerConfig::alpha},
      {"t_alpha_beta3", &OptimizerConfig::t_alpha_beta3},
      {"fixed_decay", nullptr, &OptimizerConfig::fixed_decay},
      {"shampoo_beta", &OptimizerConfig::shampoo_beta},
      {"precondition_frequency", nullptr, nullptr, &OptimizerConfig::precondition_frequency},
      {"max_precondition_dim", nullptr, nullptr, &OptimizerConfig::max_precondition_dim},
      {"precondition_1d", nullptr, &OptimizerConfig::precondition_1d},
      {"correct_bias", nullptr, &OptimizerConfig::correct_bias},
      {"normalize_gradient", nullptr, &OptimizerConfig::normalize_gradient},
      {"matrix_eps", &OptimizerConfig::matrix_eps},
      {"warmup_steps", nullptr, nullptr, &OptimizerConfig::warmup_steps},
      {"r", &OptimizerConfig::r},
      {"weight_lr_power", &OptimizerConfig::weight_lr_power},
      {"weight_sum", &OptimizerConfig::weight_sum},
      {"lr_max", &OptimizerConfig::lr_max},
      {"gamma", &OptimizerConfig::gamma},
      {"optimize_1d", nullptr, &OptimizerConfig::optimize_1d},
      {"lr_1d_factor", &OptimizerConfig::lr_1d_factor},
      {"beta1_1d", &OptimizerConfig::beta1_1d},
      {"beta2_1d", &OptimizerConfig::beta2_1d},
      {"weight_decay_1d", &OptimizerConfig::weight_decay_1d},
      {"update_probability", &OptimizerConfig::update_probability},
      {"update_counter", nullptr, nullptr, &OptimizerConfig::update_counter},
      {"max_size_triangular", nullptr, nullptr, &OptimizerConfig::max_size_triangular},
      {"min_ndim_triangular", nullptr, nullptr, &OptimizerConfig::min_ndim_triangular},
      {"memory_save_mode", nullptr, nullptr, &OptimizerConfig::memory_save_mode},
      {"precondition_lr", &OptimizerConfig::precondition_lr},
      {"precondition_init_scale", &OptimizerConfig::precondition_init_scale},
      {"precondition_dtype", nullptr, nullptr, &OptimizerConfig::precondition_dtype},
      {"momentum_into_precondition_update", nullptr,
       &OptimizerConfig::momentum_into_precondition_update},
      {"head_numel", nullptr, nullptr, &OptimizerConfig::head_numel},
      {"lmo", nullptr, nullptr, &OptimizerConfig::lmo},
      {"lmo_normalize", nullptr, nullptr, &OptimizerConfig::lmo_normalize},
      {"lmo_transpose", nullptr, &OptimizerConfig::lmo_transpose},
      {"lmo_max_scale", nullptr, &OptimizerConfig::lmo_max_scale},
      {"scale", &OptimizerConfig::scale},
      {"constraint", nullptr, &OptimizerConfig::constraint},
  };
  return f;
}

}  // namespace

void OptimizerConfig::set(const std::string& key, const std::string& value) {
  const OptimizerEntry& entry = optimizer_entry(name);
  if (!entry.reads(key)) {
    bool field = key == "muon_params";
    for (const auto& f : fields()) field = field || key == f.name;
    if (!field) {
      throw InvalidArgument(fmt::format("optimizer {}: unknown hyper-parameter '{}'{}; it reads {}",
                                        name, key, did_you_mean(key, entry.keys),
                                        join(entry.keys, ", ")));
    }
    throw InvalidArgument(fmt::format("optimizer {}: key '{}' is not read by {}; it reads {}", name,
                                      key, name, join(entry.keys, ", ")));
  }
  set_stored(key, value);
}

void OptimizerConfig::set_stored(const std::string& key, const std::string& value) {
  if (key == "muon_params") {
    muon_params = value;
    return;
  }
  for (const auto& f : fields()) {
    if (key != f.name) continue;
    try {
      size_t used = 0;
      if (f.flag) {
        if (value == "true" || value == "1")
          this->*f.flag = true;
        else if (value == "false" || value == "0")
          this->*f.flag = false;
        else
          throw std::invalid_argument(value);
        return;
      }
      const double v = std::stod(value, &used);
      if (used != value.size()) throw std::invalid_argument(value);
      if (f.integer) {
        if (v != std::floor(v)) throw std::invalid_argument(value);
        this->*f.integer = static_cast<int64_t>(v);
      } else {
        this->*f.number = v;
      }
      return;
    } catch (const std::logic_error&) {
      throw InvalidArgument(fmt::format("optimizer {}: {} = '{}' is not a valid {}", name, key,
                                        value, f.flag ? "boolean (0/1/true/false)" : "number"));
    }
  }
  std::vector<std::string> names = {"muon_params"};
  for (const auto& f : fields()) names.push_back(f.name);
  throw InvalidArgument(fmt::format("optimizer {}: unknown hyper-parameter '{}'{}", name, key,
                                    did_you_mean(key, names)));
}

OptimizerConfig OptimizerConfig::parse(const std::string& spec) {
  const auto colon = spec.find(':');
  OptimizerConfig c = defaults(spec.substr(0, colon));
  if (colon == std::string::npos) return c;
  for (const auto& [key, value] :
       parse_key_values(spec.substr(colon + 1), "optimizer spec '" + spec + "'")) {
    c.set(key, value);
  }
  c.validate();
  return c;
}

std::vector<std::pair<std::string, double>> OptimizerConfig::hyper() const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& f : fields()) {
    const double v = f.flag      ? (this->*f.flag ? 1.0 : 0.0)
                     : f.integer ? static_cast<double>(this->*f.integer)
                                 : this->*f.number;
    out.emplace_back(f.name, v);
  }
  return out;
}

NamedOptimizer NamedOptimizer::parse(const std::string& spec) {
  NamedOptimizer out;
  if (spec.empty()) return out;
  const OptimizerConfig config = OptimizerConfig::parse(spec);
  out.rule = config.name;
  const auto colon = spec.find(':');
  if (colon == std::string::npos) return out;
  const auto stored = config.hyper();
  for (const auto& [key, value] :
       parse_key_values(spec.substr(colon + 1), "optimizer spec '" + spec + "'")) {
    if (key == "muon_params") {
      out.muon_params = config.muon_params;
      continue;
    }
    for (const auto& [k, v] : stored) {
      if (k == key) out.hyper.emplace_back(k, v);
    }
  }
  return out;
}

std::string OptimizerConfig::to_json() const {
  nlohmann::json j;
  j["name"] = name;
  for (const auto& [k, v] : hyper()) j["hyper"][k] = v;
  j["muon_params"] = muon_params;
  return j.dump();
}

void OptimizerConfig::validate() const {
  optimizer_entry(name);  // known name
  auto check = [&](const char* field, double v, bool ok) {
    if (!ok || !std::isfinite(v)) {
      throw InvalidArgument(fmt::format("optimizer {}: {} = {} is out of range", name, field, v));
    }
  };
  check("lr", lr, lr >= 0);
  check("weight_decay", weight_decay, weight_decay >= 0);
  check("beta1", beta1, beta1 >= 0 && beta1 < 1);
  check("beta2", beta2, beta2 >= 0 && beta2 < 1);
  check("eps", eps, eps >= 0);
  check("momentum", momentum, momentum >= 0 && momentum < 1);
  check("dampening", dampening, dampening >= 0 && dampening <= 1);
  check("ns_steps", static_cast<double>(ns_steps), ns_steps >= 0);
  check("ns_a", ns_a, true);
  check("ns_b", ns_b, true);
  check("ns_c", ns_c, true);
  check("adam_lr", adam_lr, adam_lr >= 0);
  check("adam_beta1", adam_beta1, adam_beta1 >= 0 && adam_beta1 < 1);
  check("adam_beta2", adam_beta2, adam_beta2 >= 0 && adam_beta2 < 1);
  check("adam_weight_decay", adam_weight_decay, adam_weight_decay >= 0);
  check("adam_eps", adam_eps, adam_eps >= 0);
  check("adjust_lr", static_cast<double>(adjust_lr), adjust_lr >= 0 && adjust_lr <= 2);
  check("momentum_decay", momentum_decay, momentum_decay >= 0);
  check("beta2_decay", beta2_decay, beta2_decay <= 0);
  check("eps2", eps2, eps2 >= 0);
  check("clip_threshold", clip_threshold, clip_threshold > 0);
  check("beta3", beta3, beta3 >= 0 && beta3 < 1);
  check("alpha", alpha, alpha >= 0);
  check("t_alpha_beta3", t_alpha_beta3, t_alpha_beta3 >= 0);
  check("matrix_eps", matrix_eps, matrix_eps >= 0);
  check("warmup_steps", static_cast<double>(warmup_steps), warmup_steps >= 0);
  check("r", r, r >= 0);
  check("weight_lr_power", weight_lr_power, weight_lr_power >= 0);
  check("weight_sum", weight_sum, weight_sum >= 0);
  check("lr_max", lr_max, true);
  check("gamma", gamma, gamma >= 0);
  check("lr_1d_factor", lr_1d_factor, lr_1d_factor >= 0);
  check("beta1_1d", beta1_1d, beta1_1d >= 0 && beta1_1d < 1);
  check("beta2_1d", beta2_1d, beta2_1d >= 0 && beta2_1d < 1);
  check("weight_decay_1d", weight_decay_1d, weight_decay_1d >= 0);
  check("shampoo_beta", shampoo_beta, shampoo_beta >= 0 && shampoo_beta < 1);
  check("precondition_frequency", static_cast<double>(precondition_frequency),
        precondition_frequency >= 1);
  check("max_precondition_dim", static_cast<double>(max_precondition_dim),
        max_precondition_dim >= 1);
  check("update_probability", update_probability,
        update_probability == -1.0 || (update_probability >= 0 && update_probability <= 1));
  check("update_counter", static_cast<double>(update_counter), update_counter >= 0);
  check("max_size_triangular", static_cast<double>(max_size_triangular), max_size_triangular >= 0);
  check("min_ndim_triangular", static_cast<double>(min_ndim_triangular), min_ndim_triangular >= 0);
  check("memory_save_mode", static_cast<double>(memory_save_mode),
        memory_save_mode >= 0 && memory_save_mode <= 3);
  check("precondition_lr", precondition_lr, precondition_lr >= 0);
  check("precondition_init_scale", precondition_init_scale, precondition_init_scale > 0);
  check("precondition_dtype", static_cast<double>(precondition_dtype),
        precondition_dtype == 0 || precondition_dtype == 32 || precondition_dtype == 64);
  check("head_numel", static_cast<double>(head_numel), head_numel >= 1);
  check("lmo", static_cast<double>(lmo), lmo >= 0 && lmo <= 7);
  check("lmo_normalize", static_cast<double>(lmo_normalize),
        lmo_normalize >= -1 && lmo_normalize <= 1);
  check("scale", scale, scale > 0);
  if (name == "sgd" && nesterov && (momentum <= 0 || dampening != 0)) {
    throw InvalidArgument(
        "optimizer sgd: nesterov needs momentum > 0 and dampening = 0 (as in "
        "torch.optim.SGD)");
  }
  if (!muon_params.empty()) {
    try {
      std::regex check_regex(muon_params);
    } catch (const std::regex_error& e) {
      throw InvalidArgument(fmt::format("optimizer {}: muon_params '{}' is not a valid regex: {}",
                                        name, muon_params, e.what()));
    }
  }
}

}  // namespace curv
