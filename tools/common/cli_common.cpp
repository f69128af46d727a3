#include "cli_common.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "curv/core/error.h"
#include "curv/core/runtime.h"
#include "curv/models/script_objective.h"

namespace curv::tools {

void add_runtime_args(CLI::App& app, RuntimeArgs& args) {
  app.add_option("--threads", args.threads, "ATen threads (0 = all cores)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--dtype", args.dtype, "Floating dtype of the model and all curvature numbers")
      ->capture_default_str()->check(CLI::IsMember({"float32", "float64"}));
  app.add_option("--device", args.device, "Device: cpu, or cuda / cuda:N with a CUDA LibTorch")
      ->capture_default_str();
  app.add_option("--seed", args.seed, "Seed of every random choice (directions, estimators)")
      ->capture_default_str();
  app.add_flag("--quiet", args.quiet, "No progress bar on stderr");
}

at::ScalarType parse_dtype(const std::string& text) {
  if (text == "float32") return at::kFloat;
  if (text == "float64") return at::kDouble;
  throw InvalidArgument(fmt::format("dtype '{}': expected float32 or float64", text));
}

void add_model_args(CLI::App& app, ModelArgs& args) {
  app.add_option("--model", args.model,
                 "Model: a built-in config (.json) or a TorchScript file; default: the model "
                 "config saved in the checkpoints' meta.json");
  app.add_option("--script-mode", args.script_mode,
                 "TorchScript forward: loss = forward(x, y) returns the mean loss, logits = "
                 "forward(x) returns logits for cross-entropy, auto = by arity")
      ->capture_default_str()->check(CLI::IsMember({"auto", "loss", "logits"}));
}

LoadedModel load_model(const ModelArgs& args, const RuntimeArgs& runtime,
                       const std::string& fallback_config_json) {
  LoadedModel out;
  const auto dtype = parse_dtype(runtime.dtype);
  const bool json = args.model.empty() ||
                    std::filesystem::path(args.model).extension() == ".json";
  if (json) {
    if (args.model.empty() && fallback_config_json.empty()) {
      throw InvalidArgument("no model: pass --model (a .json built-in config or a TorchScript "
                            "file); the checkpoints' meta.json carries no \"model\" config");
    }
    out.config = args.model.empty() ? ModelConfig::from_json(fallback_config_json, "meta.json")
                                    : ModelConfig::from_file(args.model);
    out.objective = make_model(out.config, ModelInit{runtime.seed, dtype, runtime.device});
    out.builtin = true;
  } else {
    ScriptOptions options;
    options.dtype = dtype;
    options.device = runtime.device;
    options.mode = args.script_mode == "loss"     ? ScriptMode::kLoss
                   : args.script_mode == "logits" ? ScriptMode::kLogits
                                                  : ScriptMode::kAuto;
    out.objective = load_script_objective(args.model, options);
  }
  out.description = out.objective->describe();
  return out;
}

std::string command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    if (i) out += ' ';
    out += argv[i];
  }
  return out;
}

Progress::Progress(size_t total, bool quiet)
    : total_(total), quiet_(quiet), tty_(isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(size_t done, const std::string& label) {
  if (quiet_) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = done > 0 ? elapsed * (total_ - done) / done : 0.0;
  const int width = 30;
  const int filled = total_ ? static_cast<int>(width * done / total_) : width;
  const std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  if (tty_) {
    std::fprintf(stderr, "\r[%s] %zu/%zu %-40.40s %6.0fs left", bar.c_str(), done, total_,
                 label.c_str(), eta);
  } else {
    std::fprintf(stderr, "[%zu/%zu] %s (%.1fs elapsed)\n", done, total_, label.c_str(), elapsed);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (!quiet_ && tty_) std::fprintf(stderr, "\n");
}

int run_tool(const char* tool, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", tool, e.what());
    return 1;
  }
}

}  // namespace curv::tools
