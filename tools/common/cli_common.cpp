#include "cli_common.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>

#include "curv/core/error.h"
#include "curv/core/runtime.h"

namespace curv::tools {

void RuntimeArgs::add_to(CLI::App& app) {
  app.add_option("--threads", threads, "ATen threads (0 = all cores)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  if (sixteen_bit) {
    app.add_option("--dtype", dtype,
                   "Floating dtype of the model's parameters and activations: float64, float32, "
                   "bfloat16 or float16 (as a checkpoint stores them; float16 on the CPU needs "
                   "LibTorch 2)")
        ->capture_default_str()
        ->check(CLI::IsMember({"float64", "float32", "bfloat16", "float16"}));
  } else {
    app.add_option("--dtype", dtype, "Floating dtype of the model and all curvature numbers")
        ->capture_default_str()
        ->check(CLI::IsMember({"float32", "float64"}));
  }
  app.add_option("--device", device, "Device: cpu, or cuda / cuda:N with a CUDA LibTorch")
      ->capture_default_str();
  app.add_option("--seed", seed, "Seed of every random choice (directions, estimators)")
      ->capture_default_str();
  app.add_flag("--quiet", quiet, "No progress bar on stderr");
  app.add_option("--dist-timeout", dist_timeout,
                 "Under torchrun: seconds a rank waits for the others before the run stops with "
                 "an error naming the lost rank (docs/distributed.md)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

ModelInit RuntimeArgs::model_init() const {
  return ModelInit{seed, parse_dtype(dtype), device_of_rank(device)};
}

void RuntimeArgs::init() const { init_runtime(RuntimeOptions{threads}); }

Provenance RuntimeArgs::provenance(const std::string& tool, int argc, char** argv) const {
  Provenance p = make_provenance(tool, join_command_line(argc, argv), dtype, seed, threads);
  p.world_size = communicator()->world_size();
  p.distributed_backend = communicator()->backend();
  return p;
}

std::shared_ptr<Communicator> RuntimeArgs::communicator() const {
  if (!communicator_) {
    DistributedOptions options;
    options.timeout_seconds = dist_timeout;
    options.device = device;
    communicator_ = communicator_from_environment(options);
  }
  return communicator_;
}

void ModelArgs::add_to(CLI::App& app) {
  app.add_option("--model", model,
                 "Model: a built-in config (.json) or a TorchScript file; default: the model "
                 "config saved in the checkpoints' meta.json");
  app.add_option("--script-mode", script_mode,
                 "TorchScript forward: loss = forward(x, y) returns the mean loss, logits = "
                 "forward(x) returns logits for cross-entropy, auto = by arity")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "loss", "logits"}));
  app.add_option("--structure", structure,
                 "TorchScript models: a JSON mapping of parameter names to roles and the head "
                 "counts (docs/architectures.md); default: roles from the parameter names")
      ->check(CLI::ExistingFile);
}

ModelSource ModelArgs::to_source(const RuntimeArgs& runtime) const {
  ModelSource source;
  source.path = model;
  source.script_mode = parse_script_mode(script_mode);
  source.structure_mapping = structure;
  source.init = runtime.model_init();
  return source;
}

const FlagNames& ModelArgs::flags() {
  static const FlagNames map = {{"ModelSource.path", "--model"}};
  return map;
}

const FlagNames& RuntimeArgs::flags() {
  static const FlagNames map = {{"DistributedOptions.timeout_seconds", "--dist-timeout"},
                                {"ModelInit.dtype", "--dtype"}};
  return map;
}

std::string with_flag_names(const Error& error, const FlagNames& flags) {
  return error.render([&](const Error::Named& named) {
    const auto flag = flags.find(named.option);
    if (flag == flags.end()) return Error::library_name(named);
    return named.value.empty() ? flag->second : flag->second + " " + named.value;
  });
}

void validate_with_flags(const std::function<void()>& body, const FlagNames& flags) {
  try {
    body();
  } catch (const InvalidOption& e) {
    throw InvalidArgument(with_flag_names(e, flags));
  }
}

Progress::Progress(bool quiet)
    : quiet_(quiet), tty_(isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}

void Progress::update(size_t done, size_t total, const std::string& label) {
  if (quiet_) return;
  drawn_ = true;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = done > 0 ? elapsed * static_cast<double>(total - done) / done : 0.0;
  const int width = 30;
  const int filled = total ? static_cast<int>(width * done / total) : width;
  const std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  if (tty_) {
    std::fprintf(stderr, "\r[%s] %zu/%zu %-40.40s %6.0fs left", bar.c_str(), done, total,
                 label.c_str(), eta);
  } else {
    std::fprintf(stderr, "[%zu/%zu] %s (%.1fs elapsed, %.0fs left)\n", done, total, label.c_str(),
                 elapsed, eta);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (!quiet_ && tty_ && drawn_) std::fprintf(stderr, "\n");
}

ProgressCallback Progress::callback() {
  return
      [this](size_t done, size_t total, const std::string& label) { update(done, total, label); };
}

namespace {

volatile std::sig_atomic_t stop_signal = 0;

extern "C" void on_stop_signal(int signal) {
  stop_signal = signal;
  // A second signal is not caught: it ends the process.
  std::signal(signal, SIG_DFL);
}

}  // namespace

void install_stop_signals() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

Interrupted::Interrupted(int signal)
    : std::runtime_error(signal == SIGINT    ? "SIGINT"
                         : signal == SIGTERM ? "SIGTERM"
                                             : "a signal"),
      signal_(signal) {}

void stop_if_requested() {
  if (stop_signal != 0) throw Interrupted(stop_signal);
}

void stop_if_requested(Communicator& comm) {
  if (!comm.distributed()) return stop_if_requested();
  std::vector<double> signals(static_cast<size_t>(comm.world_size()), 0.0);
  signals[static_cast<size_t>(comm.rank())] = stop_signal;
  comm.all_reduce_sum(signals.data(), signals.size());
  for (double s : signals) {
    if (s != 0.0) throw Interrupted(static_cast<int>(s));
  }
}

int run_tool(const char* tool, const FlagNames& flags, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Interrupted& e) {
    std::fprintf(stderr,
                 "\n%s: interrupted by %s; the output holds every unit finished before it. Run the "
                 "same command with --resume to continue.\n",
                 tool, e.what());
    return 128 + e.signal();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, with_flag_names(e, flags).c_str());
    return 1;
  } catch (const c10::Error& e) {
    // An allocation that failed outside any probe pass (reading, building the model): one line
    // saying so, never LibTorch's backtrace.
    const std::string what = e.what_without_backtrace();
    const bool memory = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
                        what.find("not enough memory") != std::string::npos;
    std::fprintf(stderr, "%s: %s: %s\n", tool, memory ? "error: out of memory" : "internal error",
                 what.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", tool, e.what());
    return 1;
  }
}

}  // namespace curv::tools
