// A built-in config declared once: each field's JSON key, its member of the config struct, its
// bound and when it is written. The declaration gives the
// architecture's keys, the parsing of libcurv's model config JSON, the JSON written as every
// output file's provenance, and the bounds validate() checks before the relations between fields
// the architecture checks itself, and the parameter count, from the model the config builds on
// the meta device. Not public API.
#pragma once

#include <fmt/format.h>

#include <any>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "curv/core/error.h"
#include "models/architecture.h"

namespace curv {

enum class FieldBound {
  kAny,
  kPositive,     // > 0 (sizes, epsilons, rotary bases)
  kNonNegative,  // >= 0, where 0 means "derived" or "none" (num_key_value_heads, sliding_window)
  kTokenId,      // -1 (none) or a token id below the config's vocab_size (pad_token_id)
};

template <typename Config>
struct ConfigField {
  using Member =
      std::variant<int64_t Config::*, double Config::*, bool Config::*, std::string Config::*,
                   std::vector<int64_t> Config::*, std::vector<std::string> Config::*>;
  const char* key;
  Member member;
  FieldBound bound = FieldBound::kAny;
  // Written only where this holds (nullptr: always): a field left out where it does not change
  // the model, so that configs written before it existed read, and compare, alike.
  bool (*written_if)(const Config&) = nullptr;
};

template <typename Config>
using ConfigFields = std::vector<ConfigField<Config>>;

// The fields every Hugging Face decoder's config has, for a struct with these members, followed
// by `own`: the architecture's other fields.
template <typename C>
ConfigFields<C> decoder_fields(std::initializer_list<ConfigField<C>> own) {
  ConfigFields<C> fields = {
      {"vocab_size", &C::vocab_size, FieldBound::kPositive},
      {"hidden_size", &C::hidden_size, FieldBound::kPositive},
      {"intermediate_size", &C::intermediate_size, FieldBound::kPositive},
      {"num_hidden_layers", &C::num_hidden_layers, FieldBound::kPositive},
      {"num_attention_heads", &C::num_attention_heads, FieldBound::kPositive},
      {"max_position_embeddings", &C::max_position_embeddings, FieldBound::kPositive}};
  fields.insert(fields.end(), own);
  return fields;
}

// A TypedArchitecture whose config is declared by fields(); check_relations() checks what one
// field's bound cannot say (a head count dividing another, a list's length), after the bounds.
template <typename Config>
class DeclaredConfigArchitecture : public TypedArchitecture<Config> {
 public:
  virtual const ConfigFields<Config>& fields() const = 0;
  virtual void check_relations(const Config&) const {}
  // The config as written: derived values resolved where the written file should state them.
  virtual Config written(const Config& c) const { return c; }

  std::vector<std::string> keys() const override {
    std::vector<std::string> keys;
    for (const auto& f : fields()) keys.push_back(f.key);
    return keys;
  }

  // Keys absent from `j` take the architecture's defaults(), which one struct serving several
  // architectures may vary. A value of the wrong type is a FormatError naming `origin` and the key.
  Config from_json(const nlohmann::json& j, const std::string& origin) const override {
    Config c = this->typed(this->defaults());
    for (const auto& f : fields()) {
      const auto it = j.find(f.key);
      if (it == j.end() || it->is_null()) continue;
      std::visit(
          [&](auto member) {
            using T = std::decay_t<decltype(c.*member)>;
            try {
              c.*member = it->template get<T>();
            } catch (const nlohmann::json::exception&) {
              throw FormatError(fmt::format("{}: model config key '{}' is {}, expected {}", origin,
                                            f.key, it->dump(), type_name<T>()));
            }
          },
          f.member);
    }
    return c;
  }

  nlohmann::json to_json_object(const Config& config) const override {
    const Config c = written(config);
    nlohmann::json j = nlohmann::json::object();
    for (const auto& f : fields()) {
      if (f.written_if != nullptr && !f.written_if(c)) continue;
      std::visit([&](auto member) { j[f.key] = c.*member; }, f.member);
    }
    return j;
  }

  // The model built on the meta device: its parameters' shapes from the same registration that
  // builds it, with no storage, so a config of any size counts at once (up to stop_above).
  double parameter_count(const std::any& config, double stop_above) const override {
    ModelInit init;
    init.device = "meta";
    init.draw = false;
    ParameterTally tally(stop_above);
    try {
      this->build(this->typed(config), init);
    } catch (const ParameterTally::Exceeded&) {
    }
    return tally.count();
  }

  void validate_config(const Config& c) const final {
    int64_t vocab_size = -1;
    for (const auto& f : fields()) {
      if (const auto* m = std::get_if<int64_t Config::*>(&f.member);
          m && std::string(f.key) == "vocab_size") {
        vocab_size = c.**m;
      }
    }
    for (const auto& f : fields()) {
      std::visit([&](auto member) { check_bound(f, c.*member, vocab_size); }, f.member);
    }
    check_relations(c);
  }

 private:
  template <typename T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, int64_t>) return "an integer";
    if constexpr (std::is_same_v<T, double>) return "a number";
    if constexpr (std::is_same_v<T, bool>) return "true or false";
    if constexpr (std::is_same_v<T, std::string>) return "a string";
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "a list of integers";
    return "a list of strings";
  }

  template <typename T>
  static void check_bound(const ConfigField<Config>& f, const T& value, int64_t vocab_size) {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      switch (f.bound) {
        case FieldBound::kAny:
          return;
        case FieldBound::kPositive:
          return require_positive(f.key, static_cast<double>(value));
        case FieldBound::kNonNegative:
          if (!(value >= 0)) {
            throw InvalidArgument(fmt::format("model config: {} = {} must be >= 0", f.key, value));
          }
          return;
        case FieldBound::kTokenId:
          if (value < -1 || (vocab_size >= 0 && value >= vocab_size)) {
            throw InvalidArgument(fmt::format(
                "model config: {} = {} must be a token id below vocab_size = {} (or -1: none)",
                f.key, value, vocab_size));
          }
          return;
      }
    } else if (f.bound != FieldBound::kAny) {
      throw std::logic_error(fmt::format("config field '{}': a bound on a non-number", f.key));
    }
  }
};

}  // namespace curv
