#include "curv/models/model_loader.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "curv/core/error.h"
#include "curv/core/param_space.h"

namespace curv {

ScriptMode parse_script_mode(const std::string& text) {
  if (text == "auto") return ScriptMode::kAuto;
  if (text == "loss") return ScriptMode::kLoss;
  if (text == "logits") return ScriptMode::kLogits;
  throw InvalidArgument(fmt::format("script mode '{}': expected auto, loss or logits", text));
}

at::ScalarType parse_dtype(const std::string& text) {
  if (const auto dtype = floating_dtype_named(text)) return *dtype;
  throw InvalidArgument(
      fmt::format("dtype '{}': expected float64, float32, bfloat16 or float16", text));
}

namespace {

// A config whose model would be far larger than the weights meant for it (a vocab_size of 2e9
// beside a 97-row embedding) must fail here, not in the allocator.
void check_config_fits(const ModelConfig& config, const std::string& origin,
                       const StoredWeights& weights) {
  if (weights.elements < 0) return;
  const double stored = static_cast<double>(weights.elements);
  const double implied = config.parameter_count(4.0 * stored);  // a lower bound above that
  if (!std::isfinite(implied) || implied <= 4.0 * stored) return;
  throw FormatError(fmt::format(
      "{}: the config describes {} with at least {:.4g} parameters, but the weights ({}) hold {}: "
      "the config does not belong to these weights",
      origin, config.describe(), implied, weights.origin, weights.elements));
}

}  // namespace

LoadedModel load_model(const ModelSource& source, const std::string& recorded_config_json,
                       const std::string& recorded_origin, const StoredWeights& weights) {
  LoadedModel out;
  const bool json =
      source.path.empty() || std::filesystem::path(source.path).extension() == ".json";
  if (json) {
    if (source.path.empty() && recorded_config_json.empty()) {
      throw InvalidArgument(
          "no model: give {0} (a .json built-in config, a Hugging Face config.json or a "
          "TorchScript file); the checkpoints carry no model config (meta.json's \"model\", "
          "a Hugging Face folder's config.json or nanoGPT's model_args)",
          {{"ModelSource.path", ""}});
    }
    if (!source.structure_mapping.empty()) {
      throw InvalidArgument(fmt::format(
          "structure mapping {}: only TorchScript models take one; built-in architectures "
          "know their parameters' roles",
          source.structure_mapping));
    }
    out.config = source.path.empty() ? ModelConfig::from_json(recorded_config_json, recorded_origin)
                                     : ModelConfig::from_file(source.path);
    check_config_fits(out.config, source.path.empty() ? recorded_origin : source.path, weights);
    out.objective = make_model(out.config, source.init);
    out.builtin = true;
  } else {
    ScriptOptions options;
    options.dtype = source.init.dtype;
    options.device = source.init.device;
    options.mode = source.script_mode;
    options.structure_mapping = source.structure_mapping;
    out.objective = load_script_objective(source.path, options);
  }
  out.description = out.objective->describe();
  return out;
}

}  // namespace curv
