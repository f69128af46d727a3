// Plumbing shared by the command-line tools: the runtime and model argument groups, flag names
// in the library's validation messages, a progress bar on stderr, and the error boundary that
// turns curv::Error into a message and a non-zero exit.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "curv/analysis/report.h"
#include "curv/core/distributed.h"
#include "curv/core/progress.h"
#include "curv/models/model_loader.h"

namespace curv::tools {

// A library option's name ("Struct.field") -> the flag that sets it (with_flag_names).
using FlagNames = std::map<std::string, std::string>;

// --threads, --dtype, --device, --seed, --quiet, --dist-timeout.
struct RuntimeArgs {
  int threads = 0;
  std::string dtype = "float32";
  std::string device = "cpu";
  uint64_t seed = 0;
  bool quiet = false;
  int64_t dist_timeout = DistributedOptions{}.timeout_seconds;
  // Whether --dtype takes bfloat16 and float16 (probing does; training keeps float32 or float64).
  bool sixteen_bit = true;

  void add_to(CLI::App& app);
  ModelInit model_init() const;  // seed, dtype, device
  // The runtime (ATen threads, TorchScript executor) set up for this process.
  void init() const;
  // Provenance with this tool's name, its command line and the runtime's fields.
  Provenance provenance(const std::string& tool, int argc, char** argv) const;
  // The ranks torchrun's environment describes (one process without it), joined on first use.
  std::shared_ptr<Communicator> communicator() const;
  // Progress and results are printed by rank 0 only.
  bool prints() const { return communicator()->is_root(); }
  static const FlagNames& flags();

 private:
  mutable std::shared_ptr<Communicator> communicator_;
};

// --model, --script-mode.
struct ModelArgs {
  std::string model;  // .json built-in config, else TorchScript file
  std::string script_mode = "auto";
  std::string structure;  // a structure mapping file (TorchScript models)

  void add_to(CLI::App& app);
  ModelSource to_source(const RuntimeArgs& runtime) const;
  static const FlagNames& flags();
};

// Library options name their fields ("EigenOptions.bottom = 2"); a tool's users know flags.
// FlagNames maps an option's name, "Struct.field", to the flag that sets it: the option written
// "--flag value" (or "--flag" when the message names it alone); options without a flag keep the
// library's name.
std::string with_flag_names(const Error& error, const FlagNames& flags);
// Runs `body`; an InvalidOption from it is rethrown as an InvalidArgument with flag names.
void validate_with_flags(const std::function<void()>& body, const FlagNames& flags);

// A progress bar on stderr: redrawn in place on a terminal, one line per update otherwise, with
// elapsed and remaining time.
class Progress {
 public:
  explicit Progress(bool quiet);
  void update(size_t done, size_t total, const std::string& label);
  void finish();
  ProgressCallback callback();

 private:
  bool quiet_, tty_, drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

// SIGINT and SIGTERM: the first asks the run to stop at its next safe point, where
// stop_if_requested() is called (ndsprobe: after a unit, its results then committed to the output);
// a second one ends the process at once with the signal's default action.
void install_stop_signals();
// A stop was asked for by `signal()`; run_tool turns it into exit status 128 + signal.
class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(int signal);
  int signal() const { return signal_; }

 private:
  int signal_;
};
// Throws Interrupted when a stop signal has arrived since install_stop_signals().
void stop_if_requested();
// The same for several ranks, as a collective: when any rank received a signal, every rank
// throws Interrupted at this same point, so all of them stop after the same committed unit.
void stop_if_requested(Communicator& comm);

// Runs `body`; curv::Error and other exceptions become "TOOL: error: message" on stderr and
// exit code 1, the options a curv::Error names written by `flags`; Interrupted "TOOL: interrupted
// ..." and 128 + the signal. CLI11 parse errors exit with CLI11's own non-zero codes.
int run_tool(const char* tool, const FlagNames& flags, const std::function<int()>& body);

}  // namespace curv::tools
