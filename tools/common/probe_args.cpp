#include "probe_args.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <regex>

#include "curv/core/error.h"
#include "curv/io/checkpoint.h"
#include "curv/io/checkpoint_layout.h"

namespace curv::tools {

void CheckpointArgs::add_to(CLI::App& app) {
  app.add_option("checkpoints", runs,
                 "Checkpoint directories, one run each (step_<N>/, nanoGPT ckpt*.pt, Hugging Face "
                 "checkpoint-<N>/ or step_<N>.pt; see --layout)");
  // The registered layouts (a program's own included); parse_checkpoint_layout names a wrong one.
  std::string names;
  for (const auto& name : checkpoint_layout_names()) names += ", " + name;
  app.add_option("--layout", layout, "Checkpoint layout: auto (detected)" + names)
      ->capture_default_str();
  app.add_option("--param-order", param_order,
                 "Order of a torch optimizer's parameter indices: auto, model, ndim (nanoGPT: "
                 "matrices first), hidden (Muon: hidden matrices first), modded (modded-nanogpt's "
                 "AdamW and size-sorted Muon groups), trainer (the Hugging Face Trainer's decayed "
                 "and undecayed groups) or file:PATH (one name per line)")
      ->capture_default_str();
  std::string rules;
  for (const auto& line : torch_optimizer_rules()) rules += "\n  " + line;
  app.add_option("--optimizer", optimizer,
                 "The optimizer that saved the runs' states, checked against each state instead "
                 "of recognised by its keys, optionally with KEY=VALUE,... over the saved "
                 "hyper-parameters (docs/optimizers.md). Rules, with the writers and per-parameter "
                 "state keys they read:" +
                     rules);
  app.add_option("--steps", steps,
                 "Checkpoint steps to probe: FIRST:LAST, FIRST:, :LAST (inclusive)");
  app.add_option("--stride", stride, "Probe every K-th selected checkpoint")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--allow-extra", allow_extra,
               "Ignore checkpoint tensors that are not model parameters");
  app.add_flag("--no-prefetch", no_prefetch,
               "Read each checkpoint when its turn comes instead of reading the next one in the "
               "background while the current one computes");
  app.add_option("--prefetch-bytes", prefetch_bytes,
                 "Host memory the checkpoints read ahead may hold (suffix K, M, G, T: powers of "
                 "1024); a checkpoint that does not fit is opened ahead and read into the model "
                 "tensor by tensor at its turn")
      ->capture_default_str();
  app.add_flag("--full-digest", full_digest,
               "Guard --resume with a CRC-32 of every byte of every checkpoint file instead of "
               "the digest of what the files record (sizes, zip CRCs, safetensors headers, DCP "
               ".metadata, sampled blocks)");
}

void CheckpointArgs::to_options(ProbeRunOptions& options) const {
  options.runs = runs;
  options.layout = parse_checkpoint_layout(layout);
  options.param_order = parse_param_order(param_order);
  options.optimizer = optimizer;
  options.steps = StepSelection::parse(steps, stride);
  options.allow_extra = allow_extra;
  options.prefetch = !no_prefetch;
  options.prefetch_bytes = parse_bytes(prefetch_bytes, "--prefetch-bytes");
  options.full_digest = full_digest;
}

void ProbeDataArgs::add_to(CLI::App& app) {
  app.add_option("--data", data,
                 "Probe data: safetensors file with 'inputs' and 'targets', or a uint16 token "
                 "file (nanoGPT's .bin; needs --block-size)");
  app.add_option("--block-size", block_size,
                 "Window length T for uint16 token data: --examples windows at seeded offsets")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch-size", batch_size, "Probe batch size (examples per HVP batch)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--examples", examples, "Use the first N probe examples (0 = all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

ProbeDataSource ProbeDataArgs::to_source(uint64_t seed) const {
  ProbeDataSource source;
  source.path = data;
  source.block_size = block_size;
  source.options.batch_size = batch_size;
  source.options.max_examples = examples;
  source.seed = seed;
  return source;
}

const FlagNames& ProbeDataArgs::flags() {
  static const FlagNames map = {
      {"ProbeDataSource.block_size", "--block-size"},
      {"ProbeDataOptions.max_examples", "--examples"},
      {"ProbeDataOptions.batch_size", "--batch-size"},
      {"ProbeDataSource.path", "--data"},
  };
  return map;
}

void DirectionArgs::add_to(CLI::App& app) {
  app.add_option("--directions", directions, "Directions, comma-separated (see --list-directions)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("--whatif-fallback", whatif_fallback,
               "Optimizer directions at checkpoints without usable saved state take a what-if "
               "step from fresh state (noted in the output) instead of failing");
  app.add_flag("--list-directions", list, "List the known directions and exit");
  app.add_option("--compare", compare,
                 "Paired NDS comparison A:B of two directions on the same probe batches "
                 "(adamw.whatif:muon.whatif, or RUN/DIRECTION:RUN/DIRECTION across runs); "
                 "repeatable");
}

std::vector<std::string> DirectionArgs::specs() const {
  std::vector<std::string> out;
  for (const auto& piece : directions) {
    if (!out.empty() && piece.find('=') != std::string::npos &&
        piece.find(':') == std::string::npos && out.back().find(':') != std::string::npos) {
      out.back() += "," + piece;
    } else {
      out.push_back(piece);
    }
  }
  return out;
}

void DirectionArgs::to_options(ProbeRunOptions& options) const {
  options.directions = specs();
  options.whatif_fallback = whatif_fallback;
  for (const auto& pair : compare) options.comparisons.push_back(NdsPairSpec::parse(pair));
}

void AuditArgs::add_to(CLI::App& app) {
  app.add_option("--blocks", blocks,
                 "Block rule: layer (transformer layers + embeddings + head), component "
                 "(each layer's attn.qk, attn.vo, mlp, norm), tensor, whole")
      ->capture_default_str()
      ->check(CLI::IsMember({"layer", "component", "tensor", "whole"}));
  app.add_option("--block-group", block_groups,
                 "User block NAME=REGEX (repeatable; overrides --blocks; unmatched go to 'rest')");
  app.add_option("--coupling", coupling,
                 "Coupling matrix: full (one HVP per block), random (Rademacher estimate of "
                 "each C_ll), none (row sums only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"full", "random", "none"}));
  app.add_option("--coupling-samples", coupling_samples, "HVPs of --coupling random")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  app.add_option("--multipliers", multipliers,
                 "Also compare predicted and realized change at θ + η·u for these η")
      ->delimiter(',');
  app.add_flag("--no-realized", no_realized,
               "Skip evaluating L(θ+u) (saves one forward pass per batch)");
  app.add_flag("--within", within,
               "Within-block breakdown of matrix parameters: singular-mode curvature, head / "
               "Q,K,V groups, update isotropy");
  app.add_option("--within-params", within_params,
                 "Regex of parameters for --within (default: 2-D, not embeddings or head)");
  app.add_option("--modes", modes, "Singular modes per matrix for --within (one HVP each)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--row-chunks", row_chunks, "Row groups for non-attention matrices in --within")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--within-max-hvps", within_max_hvps, "HVP budget of --within per unit (0 = none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--token-buckets", token_buckets,
                 "Also audit each token-frequency bucket of the loss: head[:MASS] (head/tail) or "
                 "quantiles:K");
  app.add_flag("--ggn", ggn,
               "Split uᵀHu into its Gauss-Newton part uᵀGu (>= 0) and the residual (models "
               "scored by cross-entropy on logits)");
  app.add_flag("--ggn-blocks", ggn_blocks,
               "With --ggn: also each block's G_ll (one JVP per block and batch)");
  app.add_option("--token-counts", token_counts,
                 "Token counts (JSON array by id) defining the buckets instead of the probe set's "
                 "targets");
}

BlockOptions AuditArgs::block_options() const {
  BlockOptions options;
  options.rule = BlockPartition::parse_rule(blocks);
  for (const auto& g : block_groups) {
    const auto eq = g.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == g.size()) {
      throw InvalidArgument(fmt::format("--block-group '{}': expected NAME=REGEX", g));
    }
    options.groups.emplace_back(g.substr(0, eq), g.substr(eq + 1));
  }
  return options;
}

void AuditArgs::to_options(ProbeRunOptions& options, uint64_t seed) const {
  options.taylor.coupling = parse_coupling_mode(coupling);
  options.taylor.coupling_samples = coupling_samples;
  options.taylor.seed = seed;
  options.taylor.realized = !no_realized;
  options.taylor.step_multipliers = multipliers;
  options.within = within;
  options.within_options.param_regex = within_params;
  options.within_options.modes = modes;
  options.within_options.row_chunks = row_chunks;
  options.within_options.max_hvps = within_max_hvps;
  if (ggn_blocks && !ggn) throw InvalidArgument("--ggn-blocks needs --ggn");
  options.taylor.ggn = ggn;
  options.taylor.ggn_blocks = ggn_blocks;
  if (!token_buckets.empty()) {
    options.token_buckets = TokenBucketOptions::parse(token_buckets);
    options.token_buckets.counts_path = token_counts;
  } else if (!token_counts.empty()) {
    throw InvalidArgument("--token-counts needs --token-buckets");
  }
}

const FlagNames& AuditArgs::flags() {
  static const FlagNames map = {
      {"TaylorOptions.coupling_samples", "--coupling-samples"},
      {"TaylorOptions.step_multipliers", "--multipliers"},
      {"WithinOptions.param_regex", "--within-params"},
      {"WithinOptions.modes", "--modes"},
      {"WithinOptions.row_chunks", "--row-chunks"},
      {"WithinOptions.max_hvps", "--within-max-hvps"},
      {"TaylorOptions.coupling", "--coupling"},
      {"TaylorOptions.ggn", "--ggn"},
      {"TokenBucketOptions", "--token-buckets"},
      {"BlockOptions.rule", "--blocks"},
  };
  return map;
}

void SpectrumArgs::add_to(CLI::App& app) {
  app.add_flag("--spectrum", spectrum,
               "Extreme eigenvalues of H per checkpoint (with Ritz residuals and HVP counts)");
  app.add_option("--eig-top", eig_top,
                 "Largest (algebraic) eigenvalues for --spectrum, --overlap; largest |λ| with "
                 "--eig-method power")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  eig_bottom_option =
      app.add_option("--eig-bottom", eig_bottom, "Smallest (algebraic) eigenvalues for --spectrum")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber);
  app.add_option("--eig-tol", eig_tol,
                 "Convergence: Ritz residual ≤ tol·|λ| (power: relative change of the Rayleigh "
                 "quotient)")
      ->capture_default_str();
  app.add_option("--eig-bound", eig_bound,
                 "Error bound of the Lanczos stopping rule: residual (|θ−λ| ≤ r) or gap "
                 "(min(r, r²/gap))")
      ->capture_default_str()
      ->check(CLI::IsMember({"residual", "gap"}));
  app.add_option("--eig-method", eig_method,
                 "Eigen-solver: lanczos (one Krylov space, full reorthogonalisation), spectra "
                 "(restarted), power (baseline)")
      ->capture_default_str()
      ->check(CLI::IsMember({"lanczos", "spectra", "power"}));
  app.add_option("--eig-max-hvps", eig_max_hvps, "HVP budget of each eigen-solve")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  app.add_option("--krylov-basis", krylov_basis,
                 "Where the Lanczos basis of --spectrum and --density and Hutch++'s sketch of "
                 "--trace live: device (the model's; no transfer per HVP), host (pinned host "
                 "memory on a GPU: device memory for a few vectors only, the vectors copied in "
                 "as they are used) or none (two vectors, no reorthogonalisation: one "
                 "eigenvalue per end, Ritz vectors by running again; not for hutchpp)")
      ->capture_default_str()
      ->check(CLI::IsMember({"device", "host", "none"}));
  app.add_flag("--spectrum-blocks", spectrum_blocks,
               "Also eigenvalues and traces of each block's H_ll (blocks as --blocks)");
  app.add_option("--trace", trace, "Trace of H per checkpoint: none, hutchinson, hutchpp")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "hutchinson", "hutchpp"}));
  app.add_option("--trace-hvps", trace_hvps, "HVP budget of each trace estimate")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  app.add_flag("--density", density,
               "Spectral density of H per checkpoint by stochastic Lanczos quadrature");
  app.add_option("--slq-runs", slq_runs, "Start vectors of --density")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--slq-steps", slq_steps, "Lanczos steps per --density run")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--density-sigma", density_sigma,
                 "Gaussian smoothing width of --density in eigenvalue units (0 = 1% of the "
                 "Ritz-value spread)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--density-grid", density_grid, "Points of the smoothed --density curve")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
  app.add_flag("--precond-sharpness", precond_sharpness,
               "λ_max(P^-1/2 H P^-1/2) with Adam's P = sqrt(v̂)+ε from the checkpoint, beside "
               "(2+2β₁)/((1−β₁)·lr)");
  app.add_flag("--overlap", overlap,
               "Per direction: share of ‖u‖² in the top --eig-top eigenspace, and cosine with "
               "the gradient");
}

CheckpointSpectrumOptions SpectrumArgs::to_options(uint64_t seed) const {
  CheckpointSpectrumOptions o;
  o.eigenvalues = spectrum;
  o.per_block = spectrum_blocks;
  o.trace = trace != "none";
  o.density = density;
  o.precond_sharpness = precond_sharpness;
  o.overlap = overlap;
  o.eigen.top = eig_top;
  o.eigen.method = parse_eigen_method(eig_method);
  const bool bottom_given = eig_bottom_option != nullptr && eig_bottom_option->count() > 0;
  o.eigen.bottom = o.eigen.method == EigenMethod::kPower && !bottom_given ? 0 : eig_bottom;
  o.eigen.tol = eig_tol;
  o.eigen.bound = parse_error_bound(eig_bound);
  o.eigen.max_hvps = eig_max_hvps;
  o.eigen.seed = seed;
  o.eigen.basis = parse_krylov_basis(krylov_basis);
  if (o.trace) o.trace_options.method = parse_trace_method(trace);
  o.trace_options.matvecs = trace_hvps;
  o.trace_options.seed = seed;
  o.density_options.runs = slq_runs;
  o.density_options.steps = slq_steps;
  o.density_options.sigma = density_sigma;
  o.density_options.grid = density_grid;
  o.density_options.seed = seed;
  o.density_options.basis = o.eigen.basis;
  o.trace_options.basis = o.eigen.basis;
  return o;
}

const FlagNames& SpectrumArgs::flags() {
  static const FlagNames map = {
      {"EigenOptions.top", "--eig-top"},           {"EigenOptions.bottom", "--eig-bottom"},
      {"EigenOptions.tol", "--eig-tol"},           {"EigenOptions.max_hvps", "--eig-max-hvps"},
      {"EigenOptions", "--eig-top/--eig-bottom"},  {"TraceOptions.matvecs", "--trace-hvps"},
      {"DensityOptions.runs", "--slq-runs"},       {"DensityOptions.steps", "--slq-steps"},
      {"DensityOptions.sigma", "--density-sigma"}, {"DensityOptions.grid", "--density-grid"},
      {"EigenOptions.basis", "--krylov-basis"},    {"TraceOptions.basis", "--krylov-basis"},
  };
  return map;
}

void EngineArgs::add_to(CLI::App& app) {
  app.add_option("--hvp", hvp, "HVP method: exact (double backward) or fd (central differences)")
      ->capture_default_str()
      ->check(CLI::IsMember({"exact", "fd"}));
  app.add_option("--vector-dtype", vector_dtype,
                 "Dtype of directions, gradients and HVPs: auto (the model's, float32 for a "
                 "16-bit model), float64, float32, bfloat16 or float16; dot products and norms "
                 "accumulate in float64 whatever it is")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "float64", "float32", "bfloat16", "float16"}));
  app.add_option("--fd-step", fd_step,
                 "With --hvp fd: the norm of the perturbation h·v; 0 picks one by the model's "
                 "dtype (docs/concepts.md)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-kept-graphs", max_kept_graphs,
                 "Keep at most N gradient graphs between HVPs, one per probe batch or, with "
                 "--micro-batch, per slice (0 = all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-memory", max_memory,
                 "Keep gradient graphs only while the memory of the model's device (the "
                 "process's resident memory; a GPU's allocated bytes) stays under this many bytes "
                 "(suffix K, M, G, T: powers of 1024; 0 = no bound)")
      ->capture_default_str();
  app.add_flag("--host-copies", host_copies,
               "On a GPU, keep the copy of the parameters saved during L(θ + u) and "
               "finite-difference HVPs, and the next checkpoint a delta reads, in host memory: "
               "two parameter-sized tensors less on the device, for copies over the bus");
  app.add_flag("--recompute-graphs", recompute_graphs,
               "Keep no gradient graph between HVPs: each HVP redoes the forward pass and the "
               "first backward of every batch (less memory, about 1.4x the time per HVP)");
  app.add_flag("--recompute-layers", recompute_layers,
               "Hold one layer's graph at a time: each pass keeps only the activations between "
               "layers (and their tangents), then recomputes the layers one by one (the same "
               "numbers to rounding, about 1.4x the time of --recompute-graphs per HVP; the "
               "built-in transformers)");
  app.add_option("--micro-batch", micro_batch,
                 "Run each probe batch through the model in slices of at most N sequences and sum "
                 "them (the same numbers to rounding; an HVP's graph is a slice's: less memory); "
                 "0 = whole batches")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--matmul-precision", matmul_precision,
                 "Float32 matrix products as torch.set_float32_matmul_precision: highest, high "
                 "(TF32 on CUDA) or medium (also bfloat16); below highest, each run's first "
                 "checkpoint records the relative error it brings to a batch's loss, gradient "
                 "and HVP")
      ->capture_default_str()
      ->check(CLI::IsMember({"highest", "high", "medium"}));
}

int64_t parse_bytes(const std::string& text, const std::string& flag) {
  static const std::regex pattern(R"(\s*([0-9]+(\.[0-9]*)?)\s*([KMGT]?)i?B?\s*)",
                                  std::regex::icase);
  std::smatch m;
  if (!std::regex_match(text, m, pattern)) {
    throw InvalidArgument(fmt::format(
        "{} '{}': expected a number of bytes, optionally with a K, M, G or T suffix (e.g. 5G)",
        flag, text));
  }
  const std::string suffix = m[3].str();
  const int shift =
      suffix.empty() ? 0 : 10 * (1 + std::string("KMGT").find(std::toupper(suffix[0])));
  const double bytes = std::stod(m[1].str()) * std::ldexp(1.0, shift);
  if (!(bytes < 9.2e18)) throw InvalidArgument(fmt::format("{} '{}': too large", flag, text));
  return static_cast<int64_t>(bytes);
}

const FlagNames& CheckpointArgs::flags() {
  static const FlagNames map = {
      {"ProbeRunOptions.runs", "CHECKPOINTS"},
      {"ProbeRunOptions.layout", "--layout"},
      {"ParamOrderSpec", "--param-order"},
      {"ProbeRunOptions.optimizer", "--optimizer"},
      {"ProbeRunOptions.prefetch_bytes", "--prefetch-bytes"},
  };
  return map;
}

const FlagNames& DirectionArgs::flags() {
  static const FlagNames map = {
      {"ProbeRunOptions.directions", "--directions"},
      {"ProbeRunOptions.whatif_fallback", "--whatif-fallback"},
      {"ProbeRunOptions.comparisons", "--compare"},
  };
  return map;
}

const FlagNames& EngineArgs::flags() {
  static const FlagNames map = {
      {"EngineOptions.hvp_method", "--hvp"},
      {"EngineOptions.vector_dtype", "--vector-dtype"},
      {"EngineOptions.fd_step", "--fd-step"},
      {"EngineOptions.max_kept_graphs", "--max-kept-graphs"},
      {"EngineOptions.max_memory", "--max-memory"},
      {"EngineOptions.micro_batch", "--micro-batch"},
      {"EngineOptions.host_copies", "--host-copies"},
      {"EngineOptions.recompute_layers", "--recompute-layers"},
  };
  return map;
}

FlagNames probe_flag_names() {
  FlagNames out = {{"ProbeJob.resume", "--resume"}, {"ProbeJob.memory_budget", "--memory-budget"}};
  for (const FlagNames* group :
       {&CheckpointArgs::flags(), &ProbeDataArgs::flags(), &DirectionArgs::flags(),
        &AuditArgs::flags(), &SpectrumArgs::flags(), &EngineArgs::flags(), &ModelArgs::flags(),
        &RuntimeArgs::flags()}) {
    out.insert(group->begin(), group->end());
  }
  return out;
}

EngineOptions EngineArgs::to_options() const {
  EngineOptions options;
  options.hvp_method = parse_hvp_method(hvp);
  if (vector_dtype != "auto") {
    options.vector_dtype = parse_vector_dtype(vector_dtype, at::kDouble, "--vector-dtype");
  }
  options.fd_step = fd_step;
  options.max_kept_graphs = max_kept_graphs;
  options.max_memory = parse_bytes(max_memory, "--max-memory");
  options.micro_batch = micro_batch;
  options.reuse_graph = !recompute_graphs;
  options.host_copies = host_copies;
  options.recompute_layers = recompute_layers;
  return options;
}

}  // namespace curv::tools
