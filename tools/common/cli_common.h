// Plumbing shared by the command-line tools: the runtime and model argument groups, loading a
// model (built-in JSON config or TorchScript), a progress bar on stderr, and the error boundary
// that turns curv::Error into a message and a non-zero exit.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "curv/models/models.h"
#include "curv/core/objective.h"

namespace curv::tools {

struct RuntimeArgs {
  int threads = 0;
  std::string dtype = "float32";
  std::string device = "cpu";
  uint64_t seed = 0;
  bool quiet = false;
};
void add_runtime_args(CLI::App& app, RuntimeArgs& args);
at::ScalarType parse_dtype(const std::string& text);

struct ModelArgs {
  std::string model;               // .json built-in config, else TorchScript file
  std::string script_mode = "auto";
};
void add_model_args(CLI::App& app, ModelArgs& args);

struct LoadedModel {
  std::unique_ptr<Objective> objective;
  std::string description;
  ModelConfig config;     // valid when builtin
  bool builtin = false;
};
// `fallback_config_json`: the model config found in a checkpoint's meta.json, used when
// --model is not given.
LoadedModel load_model(const ModelArgs& args, const RuntimeArgs& runtime,
                       const std::string& fallback_config_json);

// The command line as one string, for provenance.
std::string command_line(int argc, char** argv);

// A progress bar on stderr: redrawn in place on a terminal, one line per update otherwise.
class Progress {
 public:
  Progress(size_t total, bool quiet);
  void update(size_t done, const std::string& label);
  void finish();

 private:
  size_t total_;
  bool quiet_, tty_;
  std::chrono::steady_clock::time_point start_;
};

// Runs `body`; curv::Error and other exceptions become "TOOL: error: message" on stderr and
// exit code 1. CLI11 parse errors exit with CLI11's own non-zero codes.
int run_tool(const char* tool, const std::function<int()>& body);

}  // namespace curv::tools
