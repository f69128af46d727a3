// Private helpers of the built-in architectures: a typed base for registry entries (JSON through
// nlohmann, the config held in std::any), the functional model base, and the built-in list.
#pragma once

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include <any>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <typeinfo>
#include <vector>

#include "curv/core/error.h"
#include "curv/core/objective.h"
#include "curv/models/models.h"
#include "curv/models/registry.h"

namespace curv {

// A registry entry over a typed config. Subclasses give the typed parts; the std::any plumbing
// and the JSON text round trip live here.
template <typename Config>
class TypedArchitecture : public Architecture {
 public:
  std::any defaults() const override { return Config{}; }
  std::any parse(const std::string& json, const std::string& origin) const override {
    return from_json(nlohmann::json::parse(json), origin);
  }
  std::string to_json(const std::any& config) const override {
    return to_json_object(typed(config)).dump();
  }
  void validate(const std::any& config) const override { validate_config(typed(config)); }
  std::string describe(const std::any& config) const override {
    return describe_config(typed(config));
  }
  std::unique_ptr<Objective> make(const std::any& config, const ModelInit& init) const override {
    return build(typed(config), init);
  }
  ModelData data(const std::any& config) const override { return data_of(typed(config)); }
  virtual Config from_json(const nlohmann::json& j, const std::string& origin) const = 0;
  virtual nlohmann::json to_json_object(const Config& config) const = 0;
  virtual void validate_config(const Config& config) const = 0;
  virtual std::string describe_config(const Config& config) const = 0;
  virtual std::unique_ptr<Objective> build(const Config& config, const ModelInit& init) const = 0;
  virtual ModelData data_of(const Config& config) const = 0;

 protected:
  const Config& typed(const std::any& config) const {
    if (const auto* c = std::any_cast<Config>(&config)) return *c;
    throw InvalidArgument(
        fmt::format("architecture '{}' was given a config of type {}, not its own", name(),
                    config.type().name()));
  }
};

// Config structs whose every field is a JSON key (NLOHMANN_DEFINE_TYPE_*_WITH_DEFAULT): the keys.
template <typename Config>
std::vector<std::string> json_keys_of(const Config& defaults) {
  std::vector<std::string> keys;
  const nlohmann::json fields = defaults;
  for (const auto& item : fields.items()) keys.push_back(item.key());
  return keys;
}

// A TypedArchitecture whose config is a plain JSON struct (NLOHMANN_DEFINE_TYPE_*_WITH_DEFAULT):
// its keys, parsing and writing are the struct's fields. Keys absent from the JSON take the
// architecture's defaults(), which one struct serving several architectures may vary.
template <typename Config>
class JsonConfigArchitecture : public TypedArchitecture<Config> {
 public:
  std::vector<std::string> keys() const override { return json_keys_of(Config{}); }
  Config from_json(const nlohmann::json& j, const std::string&) const override {
    nlohmann::json merged = this->typed(this->defaults());
    merged.update(j);
    return merged.get<Config>();
  }
  nlohmann::json to_json_object(const Config& c) const override { return c; }
};

// The numbers a model's parameters hold, tallied while it is built (on the meta device) on this
// thread: FunctionalModel::add adds each parameter's and throws Exceeded once the tally passes
// `limit`, so that a config far larger than its weights (10⁸ layers) is not built through.
class ParameterTally {
 public:
  struct Exceeded {};
  explicit ParameterTally(double limit);
  ~ParameterTally();
  ParameterTally(const ParameterTally&) = delete;
  ParameterTally& operator=(const ParameterTally&) = delete;
  double count() const { return count_; }

 private:
  friend class FunctionalModel;
  double limit_;
  double count_ = 0;
  ParameterTally* previous_;
};

// Built-in models: parameters live in one ordered list; forward passes are plain ATen calls on
// them, so everything is twice differentiable and nothing depends on torch::nn.
class FunctionalModel : public Objective {
 public:
  const ParamSpace& space() const override { return space_; }
  ParamVector parameters() override { return params_; }
  at::Tensor loss_listing_linears(const Batch& batch, std::vector<LinearUse>& uses) override;

 protected:
  // Registers a parameter; the order of calls is the model's parameter order.
  at::Tensor& add(const std::string& name, at::Tensor value);
  void finish();
  const at::Tensor& p(size_t i) const { return params_[i]; }
  // x Wᵀ + b (x W + b when `transposed`) with W = p(weight) and b = p(bias) unless kNoBias; listed
  // while loss_listing_linears runs. Only for weights and biases the model uses nowhere else.
  at::Tensor linear_map(const at::Tensor& x, size_t weight, size_t bias = LinearUse::kNoBias,
                        bool transposed = false) const;

  std::vector<std::string> names_;
  ParamVector params_;
  ParamSpace space_;

 private:
  std::vector<LinearUse>* listing_ = nullptr;  // set while loss_listing_linears runs
};

at::Tensor mean_cross_entropy(const at::Tensor& logits, const at::Tensor& targets);

// InvalidArgument "model config: FIELD = VALUE must be > 0" unless value > 0.
void require_positive(const char* field, double value);
// Attention heads as HF's configs give them: num_key_value_heads (0: num_attention_heads) divides
// num_attention_heads, and a head has head_dim features, or hidden_size / num_attention_heads when
// head_dim is 0 (which must then divide); with `rotary` that size is even (rotary embeddings
// rotate pairs). InvalidArgument naming the fields and values.
void check_attention_heads(int64_t heads, int64_t kv_heads, int64_t hidden, int64_t head_dim,
                           bool rotary);

// Reading Hugging Face config.json files (hf_config.cpp): every key of the file must be taken by
// the architecture or listed as one that does not change the forward pass in eval mode.
class HfConfigReader {
 public:
  // `inert`: the keys every PretrainedConfig may carry count as read (false for a nested object
  // such as rope_parameters, whose every key matters).
  HfConfigReader(const nlohmann::json& config, std::string origin, bool inert = true);
  // The value of `key` when present and not null (marking it taken).
  const nlohmann::json* find(const std::string& key);
  int64_t integer(const std::string& key, int64_t fallback);
  double number(const std::string& key, double fallback);
  bool boolean(const std::string& key, bool fallback);
  std::string text(const std::string& key, const std::string& fallback);
  // A FormatError naming the file, the field and its value, saying it is not supported.
  [[noreturn]] void unsupported(const std::string& key, const std::string& why) const;
  // Marks keys that do not change the forward pass (token ids, dropout in eval mode, ...).
  void ignore(std::initializer_list<const char*> keys);
  // FormatError naming the first key neither taken nor ignored.
  void finish() const;
  const std::string& origin() const { return origin_; }

 private:
  const nlohmann::json& config_;
  std::string origin_;
  std::set<std::string> taken_;
};

// The rotary fields of a family built with the default rope type only: 4.x's top-level
// rope_theta (and, with `partial`, partial_rotary_factor) or 5.x's rope_parameters over them; a
// rope_scaling, or a rope_type other than default, is refused naming `family`.
void read_default_rope(HfConfigReader& r, const char* family, double& theta,
                       double* partial = nullptr);

}  // namespace curv
