#include "curv/models/models.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/fmt_torch.h"
#include "core/strings.h"
#include "curv/core/error.h"
#include "models/architecture.h"

namespace curv {

// ---------------------------------------------------------------------------------------------
// Config: every per-architecture step is the registry entry's.

ModelConfig::ModelConfig() : arch_("gpt"), config_(GptConfig{}) {}

ModelConfig ModelConfig::defaults(const std::string& arch) {
  ModelConfig c;
  c.arch_ = arch;
  c.config_ = find_architecture(arch).defaults();
  return c;
}

void ModelConfig::throw_wrong_type(const char* requested) const {
  throw InvalidArgument(fmt::format("model config of arch '{}' does not hold a {} (it holds a {})",
                                    arch_, requested, config_.type().name()));
}

ModelData ModelConfig::data() const { return find_architecture(arch_).data(config_); }

double ModelConfig::parameter_count(double stop_above) const {
  return find_architecture(arch_).parameter_count(config_, stop_above);
}

void ModelConfig::validate() const { find_architecture(arch_).validate(config_); }

namespace {

// A JSON number written with a fraction or exponent (2.5, 1e300) where the config holds an
// integer: nlohmann's conversion casts the double, which is undefined behaviour outside the
// integer's range. Integral values in range (64.0) are read as before.
void check_integer(const nlohmann::json& value, const nlohmann::json& like, const std::string& key,
                   const std::string& origin) {
  if (!value.is_number_float() || !like.is_number_integer()) return;
  const double v = value.get<double>();
  // Parsed defaults of 0 or more read as unsigned: such a key takes no negative value.
  const double low = like.is_number_unsigned() ? 0.0 : -9223372036854775808.0;
  const char* why = nullptr;
  if (std::trunc(v) != v) {
    why = "must be an integer";
  } else if (!(v >= low)) {
    why = "must be a non-negative integer";
  } else if (!(v < 9223372036854775808.0)) {
    why = "is too large for a 64-bit integer";
  }
  if (why) {
    throw FormatError(
        fmt::format("{}: model config key '{}' {}, got {}", origin, key, why, value.dump()));
  }
}

// check_integer on every field whose default is an integer (or a list of integers).
void check_integer_fields(const nlohmann::json& j, const nlohmann::json& defaults,
                          const std::string& origin) {
  for (const auto& item : j.items()) {
    const auto like = defaults.find(item.key());
    if (like == defaults.end()) continue;
    if (like->is_array() && item.value().is_array()) {
      if (like->empty() || !(*like)[0].is_number_integer()) continue;
      for (size_t i = 0; i < item.value().size(); ++i) {
        check_integer(item.value()[i], (*like)[0], fmt::format("{}[{}]", item.key(), i), origin);
      }
    } else {
      check_integer(item.value(), *like, item.key(), origin);
    }
  }
}

}  // namespace

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("{}: model config is not valid JSON: {}", origin, e.what()));
  }
  if (!j.is_object())
    throw FormatError(fmt::format("{}: model config must be a JSON object", origin));
  ModelConfig c;
  try {
    if (!j.contains("arch") && j.contains("model_type")) {
      // A Hugging Face config.json: the architecture that reads its model_type maps it.
      if (!j["model_type"].is_string()) {
        throw FormatError(fmt::format("{}: \"model_type\" is {}, expected a string", origin,
                                      j["model_type"].dump()));
      }
      // A named string, not a temporary: gcc 13 would warn that the reference may dangle.
      const std::string model_type = j["model_type"].get<std::string>();
      const Architecture& architecture = find_hf_architecture(model_type, origin);
      c.arch_ = architecture.name();
      c.config_ = architecture.parse_hf(text, origin);
      c.validate();
      return c;
    }
    c.arch_ = j.value("arch", std::string("gpt"));
    const Architecture& architecture = find_architecture(c.arch_);
    std::vector<std::string> known = {"arch"};
    for (const auto& key : architecture.keys()) known.push_back(key);
    for (const auto& item : j.items()) {
      if (std::find(known.begin(), known.end(), item.key()) == known.end()) {
        throw FormatError(fmt::format("{}: unknown model config key '{}'{}", origin, item.key(),
                                      did_you_mean(item.key(), known)));
      }
    }
    check_integer_fields(j, nlohmann::json::parse(architecture.to_json(architecture.defaults())),
                         origin);
    c.config_ = architecture.parse(text, origin);
  } catch (const nlohmann::json::type_error& e) {
    throw FormatError(
        fmt::format("{}: model config has a value of the wrong type: {}", origin, e.what()));
  }
  c.validate();
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw FormatError(fmt::format("cannot open model config '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

std::string ModelConfig::to_json() const {
  // nlohmann::json orders keys, so the text is the same whatever order the entry writes them in.
  nlohmann::json j = nlohmann::json::parse(find_architecture(arch_).to_json(config_));
  j["arch"] = arch_;
  return j.dump();
}

std::string ModelConfig::describe() const { return find_architecture(arch_).describe(config_); }

// ---------------------------------------------------------------------------------------------
// Shared by the built-in models

namespace {
thread_local ParameterTally* active_tally = nullptr;
}  // namespace

ParameterTally::ParameterTally(double limit) : limit_(limit), previous_(active_tally) {
  active_tally = this;
}

ParameterTally::~ParameterTally() { active_tally = previous_; }

at::Tensor& FunctionalModel::add(const std::string& name, at::Tensor value) {
  if (active_tally != nullptr) {
    active_tally->count_ += static_cast<double>(value.numel());
    if (active_tally->count_ > active_tally->limit_) throw ParameterTally::Exceeded{};
  }
  names_.push_back(name);
  params_.push_back(value.set_requires_grad(true));
  return params_.back();
}

void FunctionalModel::finish() { space_ = ParamSpace(names_, params_); }

at::Tensor FunctionalModel::loss_listing_linears(const Batch& batch, std::vector<LinearUse>& uses) {
  listing_ = &uses;
  try {
    at::Tensor value = loss(batch);
    listing_ = nullptr;
    return value;
  } catch (...) {
    listing_ = nullptr;
    throw;
  }
}

at::Tensor FunctionalModel::linear_map(const at::Tensor& x, size_t weight, size_t bias,
                                       bool transposed) const {
  const at::Tensor b = bias == LinearUse::kNoBias ? at::Tensor() : p(bias);
  at::Tensor y;
  if (!transposed) {
    y = at::linear(x, p(weight), b);
  } else {
    y = at::matmul(x, p(weight));
    if (b.defined()) y = y + b;
  }
  if (listing_ != nullptr) listing_->push_back(LinearUse{x, y, weight, bias, transposed});
  return y;
}

std::unique_ptr<Objective> make_model(const ModelConfig& config, const ModelInit& init) {
  config.validate();
  if (!at::isFloatingType(init.dtype)) {
    throw InvalidArgument(fmt::format("model dtype {} is not floating point", init.dtype));
  }
  return find_architecture(config.arch()).make(config.config(), init);
}

void require_positive(const char* field, double value) {
  if (!(value > 0)) {
    throw InvalidArgument(fmt::format("model config: {} = {} must be > 0", field, value));
  }
}

void check_attention_heads(int64_t heads, int64_t kv_heads, int64_t hidden, int64_t head_dim,
                           bool rotary) {
  const int64_t kv = kv_heads > 0 ? kv_heads : heads;
  if (heads % kv != 0) {
    throw InvalidArgument(fmt::format(
        "model config: num_key_value_heads = {} does not divide num_attention_heads = {}", kv,
        heads));
  }
  if (head_dim == 0 && hidden % heads != 0) {
    throw InvalidArgument(
        fmt::format("model config: hidden_size = {} is not divisible by num_attention_heads = {}",
                    hidden, heads));
  }
  const int64_t size = head_dim > 0 ? head_dim : hidden / heads;
  if (rotary && size % 2 != 0) {
    throw InvalidArgument(fmt::format(
        "model config: a head's {} features must be even (rotary embeddings rotate pairs)", size));
  }
}

}  // namespace curv
