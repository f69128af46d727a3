// Where a tool's model comes from: a built-in architecture's JSON config, a TorchScript file, or
// the model config a checkpoint recorded in its meta.json.
#pragma once

#include <memory>
#include <string>

#include "curv/core/objective.h"
#include "curv/models/models.h"
#include "curv/models/script_objective.h"

namespace curv {

struct ModelSource {
  // A built-in config (.json) or a TorchScript file; empty takes the checkpoint's recorded config.
  std::string path;
  ScriptMode script_mode = ScriptMode::kAuto;  // TorchScript only
  // TorchScript only: a structure mapping file (ModelStructure::from_mapping_file) giving the
  // parameters' roles and head counts; empty: the name rules. Built-in architectures know their
  // structure, so a mapping with one is an InvalidArgument.
  std::string structure_mapping;
  ModelInit init;  // seed, dtype and device
};
ScriptMode parse_script_mode(const std::string& text);  // "auto" | "loss" | "logits"
// "float64" | "float32" | "bfloat16" | "float16"
at::ScalarType parse_dtype(const std::string& text);

struct LoadedModel {
  std::unique_ptr<Objective> objective;
  std::string description;
  ModelConfig config;  // valid when `builtin`
  bool builtin = false;
};

// The numbers a checkpoint's model tensors hold and where they come from, so that a built-in
// model's config is checked against them before the model is allocated.
struct StoredWeights {
  int64_t elements = -1;  // -1: not known (no check)
  std::string origin;     // the weight files, for messages
};

// `recorded_config_json`: the model config a checkpoint carries ("" if none: its meta.json's
// "model" object, or a Hugging Face folder's config.json), used when `source.path` is empty;
// `recorded_origin` names its file in messages. InvalidArgument when neither gives a model;
// FormatError, before anything is allocated, when a built-in config implies far more parameters
// (over 4x) than `weights` hold, as a config with a wrong vocab_size or layer count does.
LoadedModel load_model(const ModelSource& source, const std::string& recorded_config_json,
                       const std::string& recorded_origin = "meta.json",
                       const StoredWeights& weights = {});

}  // namespace curv
