// The architecture registry: every built-in model family (gpt, mlp, quadratic, memory, llama,
// modded) is one entry, found by its config's "arch", that parses, validates and serialises its
// config, builds the model (parameter names, forward, structure) and says what data it reads.
// ModelConfig and make_model go through it, so adding an architecture is one file plus one
// registration.
#pragma once

#include <any>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "curv/core/objective.h"

namespace curv {

struct ModelInit;

// The data a model of an architecture reads, for tools that generate training data by arch.
struct ModelData {
  enum class Kind {
    kTokens,    // int64 token windows (batch, T <= context), ids in [0, vocab_size)
    kClasses,   // int64 class ids in [0, classes), inputs = targets
    kFeatures,  // float features (batch, features)
    kNone,      // the loss ignores the batch (any placeholder will do)
  };
  Kind kind = Kind::kNone;
  int64_t vocab_size = 0;  // kTokens
  int64_t context = 0;     // kTokens: the longest sequence
  int64_t classes = 0;     // kClasses; kFeatures: the output width
  int64_t features = 0;    // kFeatures: the input width
};

// One architecture. `config` arguments hold the architecture's typed config (e.g. GptConfig)
// as returned by defaults() or parse().
class Architecture {
 public:
  virtual ~Architecture() = default;
  virtual std::string name() const = 0;
  // The config keys it accepts besides "arch" (unknown keys are an error naming the closest).
  virtual std::vector<std::string> keys() const = 0;
  virtual std::any defaults() const = 0;
  // `json`: a config object's text whose keys are all in keys() (or "arch"); absent keys keep
  // their defaults. Throws FormatError naming `origin` on bad values.
  virtual std::any parse(const std::string& json, const std::string& origin) const = 0;
  // The config as a JSON object's text, every key of keys() that a checkpoint needs, no "arch".
  virtual std::string to_json(const std::any& config) const = 0;
  // Throws InvalidArgument naming the field and value.
  virtual void validate(const std::any& config) const = 0;
  // One line, e.g. "gpt(n_layer=4, n_head=4, ...)".
  virtual std::string describe(const std::any& config) const = 0;
  // The model, drawn from init.seed; its Objective::structure() is the architecture's exact one.
  virtual std::unique_ptr<Objective> make(const std::any& config, const ModelInit& init) const = 0;
  virtual ModelData data(const std::any& config) const = 0;
  // How many numbers the model's parameters hold, from the config alone and before anything is
  // allocated (the built-in language models are built on the meta device: shapes, no storage),
  // so that a config can be checked against the weights; NaN where the architecture does not
  // say. Counting may stop once it passes `stop_above` (a config of 10⁸ layers is not built
  // through): a result above it is a lower bound. Call on a validated config.
  virtual double parameter_count(const std::any& config,
                                 double stop_above = std::numeric_limits<double>::infinity()) const;
  // The Hugging Face model_type values (config.json) this architecture reads; empty: none.
  virtual std::vector<std::string> hf_model_types() const { return {}; }
  // The config from a Hugging Face config.json's text; FormatError naming `origin` and the field
  // for anything the architecture does not support. Only called for a model_type listed above.
  virtual std::any parse_hf(const std::string& json, const std::string& origin) const;
};

// Adds an architecture; InvalidArgument if its name is taken. The built-ins are always there.
void register_architecture(std::shared_ptr<const Architecture> architecture);
// The architecture named `name`; InvalidArgument naming it and listing the registered names.
const Architecture& find_architecture(const std::string& name);
// Registered names, in registration order (gpt, mlp, quadratic, memory, llama, modded first).
std::vector<std::string> architecture_names();
// The architecture that reads Hugging Face configs of `model_type`; FormatError naming `origin`,
// the model_type and the supported ones otherwise.
const Architecture& find_hf_architecture(const std::string& model_type, const std::string& origin);

}  // namespace curv
