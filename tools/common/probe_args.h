// ndsprobe's argument groups: each adds its flags to a CLI11 app and turns them into the
// library's options (to_options), so the tool itself is parsing plus one run_probe_job call.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cli_common.h"
#include "curv/analysis/probe_run.h"

namespace curv::tools {

// Positional checkpoint directories, --layout, --param-order, --steps, --stride, --allow-extra.
struct CheckpointArgs {
  std::vector<std::string> runs;
  std::string layout = "auto";
  std::string param_order = "auto";
  std::string optimizer;
  std::string steps;
  int64_t stride = 1;
  bool allow_extra = false;
  bool no_prefetch = false;
  std::string prefetch_bytes = "4G";
  bool full_digest = false;

  void add_to(CLI::App& app);
  void to_options(ProbeRunOptions& options) const;
  static const FlagNames& flags();
};

// --data, --block-size, --batch-size, --examples.
struct ProbeDataArgs {
  std::string data;
  int64_t block_size = 0;
  int64_t batch_size = 32;
  int64_t examples = 0;

  void add_to(CLI::App& app);
  ProbeDataSource to_source(uint64_t seed) const;
  static const FlagNames& flags();
};

// --directions, --whatif-fallback, --list-directions.
struct DirectionArgs {
  std::vector<std::string> directions = {"delta", "gradient", "random"};
  std::vector<std::string> compare;  // A:B pairs
  bool whatif_fallback = false;
  bool list = false;

  void add_to(CLI::App& app);
  // "--directions muon.whatif:match=1,lr=0.01,delta": CLI11 splits at every comma, so pieces
  // that are only key=value belong to the spec before them.
  std::vector<std::string> specs() const;
  void to_options(ProbeRunOptions& options) const;
  static const FlagNames& flags();
};

// --blocks, --block-group, --coupling, --coupling-samples, --multipliers, --no-realized,
// --within, --within-params, --modes, --row-chunks, --within-max-hvps, --token-buckets,
// --token-counts, --ggn, --ggn-blocks.
struct AuditArgs {
  std::string blocks = "layer";
  std::vector<std::string> block_groups;
  std::string coupling = "full";
  int64_t coupling_samples = 32;
  std::vector<double> multipliers;
  bool no_realized = false;
  bool within = false;
  std::string within_params;
  int64_t modes = 4;
  int64_t row_chunks = 0;
  int64_t within_max_hvps = 0;
  std::string token_buckets;
  std::string token_counts;
  bool ggn = false;
  bool ggn_blocks = false;

  void add_to(CLI::App& app);
  BlockOptions block_options() const;
  void to_options(ProbeRunOptions& options, uint64_t seed) const;
  static const FlagNames& flags();
};

// --spectrum and its eigen-solver flags, --spectrum-blocks, --trace, --trace-hvps, --density
// and its SLQ flags, --precond-sharpness, --overlap.
struct SpectrumArgs {
  bool spectrum = false;
  int64_t eig_top = 1;
  int64_t eig_bottom = 1;
  double eig_tol = 1e-6;
  std::string eig_bound = "gap";
  std::string eig_method = "lanczos";
  std::string krylov_basis = "device";
  int64_t eig_max_hvps = 300;
  bool spectrum_blocks = false;
  std::string trace = "none";
  int64_t trace_hvps = 99;
  bool density = false;
  int64_t slq_runs = 10;
  int64_t slq_steps = 80;
  double density_sigma = 0.0;
  int64_t density_grid = 1024;
  bool precond_sharpness = false;
  bool overlap = false;
  // Power iteration finds no smallest eigenvalues: the default --eig-bottom is dropped for it,
  // a given one is an error.
  const CLI::Option* eig_bottom_option = nullptr;

  void add_to(CLI::App& app);
  CheckpointSpectrumOptions to_options(uint64_t seed) const;
  static const FlagNames& flags();
};

// "5G", "1.5G", "512M", "4000000000": digits with an optional fraction, then K, M, G or T (powers
// of 1024, with or without "iB"). InvalidArgument naming `flag` and the text otherwise.
int64_t parse_bytes(const std::string& text, const std::string& flag);

// --hvp, --max-kept-graphs, --max-memory.
struct EngineArgs {
  std::string hvp = "exact";
  std::string vector_dtype = "auto";  // EngineOptions::vector_dtype ("auto": Undefined)
  double fd_step = 0.0;
  int64_t max_kept_graphs = 0;
  std::string max_memory = "0";   // bytes, or with a K, M, G or T suffix (powers of 1024)
  int64_t micro_batch = 0;        // examples per slice of a probe batch; 0 = whole batches
  bool recompute_graphs = false;  // EngineOptions::reuse_graph = false
  bool recompute_layers = false;  // EngineOptions::recompute_layers
  bool host_copies = false;       // EngineOptions::host_copies
  std::string matmul_precision = "highest";  // ProbeRunOptions::matmul_precision

  void add_to(CLI::App& app);
  EngineOptions to_options() const;
  static const FlagNames& flags();
};

// Every library option ndsprobe's flags set, by the flag (with_flag_names).
FlagNames probe_flag_names();

}  // namespace curv::tools
