#include "curv/analysis/memory_plan.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "curv/analysis/direction_registry.h"
#include "curv/analysis/probe_run.h"
#include "curv/core/directions.h"
#include "curv/core/distributed.h"
#include "curv/core/error.h"
#include "curv/core/linear_operator.h"
#include "curv/core/runtime.h"
#include "curv/io/checkpoint.h"
#include "curv/models/model_loader.h"
#include "curv/models/models.h"

namespace curv {

namespace {

// What one token of a kept graph holds, by the model's shapes: the inputs and outputs of its
// linear maps (saved by the forward pass, and their gradients again by the create_graph backward),
// its attention rows and its logits. The factors are a least-squares fit to the resident memory
// of 16 runs on the CPU (the built-in GPT and LLaMA at contexts 64 to 512, float32 and bfloat16,
// whole batches and micro-batches: docs/performance.md), which they match within 13%.
constexpr double kLinearFactor = 3.15;    // × (in + out) features of every linear map
constexpr double kAttentionFactor = 2.8;  // × heads × context per layer (scores, probabilities)
constexpr double kLogitFactor = 3.7;      // × vocabulary (logits, their float32 softmax)
// A 16-bit model's linear maps also keep float32 copies (RMSNorm's input, widened as transformers
// widens it).
constexpr double kSixteenBitFactor = 1.4;
// The second backward's intermediates, freed layer by layer as it runs: a share of a graph's.
constexpr double kSecondBackwardShare = 0.9;

struct TokenShape {
  double linear_features = 0;  // Σ over the linear maps of in + out features
  int64_t layers = 0, heads = 0, context = 0, vocab = 0;
  int64_t hidden = 0;  // the token embedding's width: what passes between layers
  size_t stages = 0;   // Objective::loss_stages
  std::string model;   // the model's description
};

// The shapes a token passes through, from the model built on the meta device.
TokenShape token_shape(const ModelConfig& config) {
  ModelInit init;
  init.device = "meta";
  init.draw = false;
  const auto model = make_model(config, init);
  const ModelStructure s = model->structure();
  const ParamSpace& space = model->space();
  TokenShape t;
  for (size_t i = 0; i < space.size(); ++i) {
    const ParamRole role = s.params.at(i).role;
    if (role == ParamRole::kTokenEmbedding && space[i].shape.size() == 2) {
      t.hidden = std::max(t.hidden, space[i].shape[1]);
    }
    if (space[i].shape.size() != 2 || role == ParamRole::kTokenEmbedding ||
        role == ParamRole::kPositionEmbedding) {
      continue;
    }
    // The head's output is the logits, counted by the vocabulary.
    t.linear_features +=
        static_cast<double>(space[i].shape[role == ParamRole::kOutputHead ? 1 : 0]);
    if (role != ParamRole::kOutputHead) t.linear_features += static_cast<double>(space[i].shape[1]);
    t.layers = std::max(t.layers, s.params[i].layer + 1);
  }
  t.heads = s.n_head;
  t.stages = model->loss_stages();
  t.model = model->describe();
  const ModelData data = config.data();
  t.context = data.context;
  t.vocab = data.vocab_size;
  return t;
}

int64_t element_bytes(at::ScalarType dtype) {
  return static_cast<int64_t>(c10::elementSize(dtype));
}

std::string count_times(double count, at::ScalarType dtype) {
  return fmt::format("{:.4g} × {} B ({})", count, element_bytes(dtype), dtype_name(dtype));
}

// The directions' needs: any reads the next checkpoint, any reads saved optimizer state.
struct DirectionNeeds {
  bool next = false, state = false;
};
DirectionNeeds direction_needs(const std::vector<std::string>& specs) {
  DirectionNeeds needs;
  for (const auto& spec : specs) {
    const auto d = make_direction(spec);
    needs.next = needs.next || d->reads_next_checkpoint();
    needs.state = needs.state || d->reads_saved_state();
  }
  return needs;
}

// What a graph kept for a slice of `tokens` tokens holds besides its gradient, by kind.
struct Activations {
  double linear = 0, attention = 0, logits = 0;
  double total() const { return linear + attention + logits; }
  std::string describe() const {
    return fmt::format(
        "{} (linear maps {}, attention {}, logits {})", format_bytes(static_cast<int64_t>(total())),
        format_bytes(static_cast<int64_t>(linear)), format_bytes(static_cast<int64_t>(attention)),
        format_bytes(static_cast<int64_t>(logits)));
  }
};

Activations activations(const TokenShape& t, double tokens, at::ScalarType dtype) {
  const double p = static_cast<double>(element_bytes(dtype));
  // A 16-bit model's attention probabilities and loss run in float32 (transformers' rule).
  const double wide = is_16_bit(dtype) ? 4.0 : p;
  Activations a;
  a.linear =
      tokens * kLinearFactor * t.linear_features * p * (is_16_bit(dtype) ? kSixteenBitFactor : 1.0);
  a.attention =
      tokens * kAttentionFactor * static_cast<double>(t.layers * t.heads * t.context) * wide;
  a.logits = tokens * kLogitFactor * static_cast<double>(t.vocab) * wide;
  return a;
}

void add_part(MemoryPlan& plan, std::string name, double bytes, std::string how,
              std::string fix = "", MemoryPhase phase = MemoryPhase::kBoth, bool on_host = false,
              bool in_passes = false) {
  plan.parts.push_back({std::move(name), static_cast<int64_t>(std::ceil(bytes)), std::move(how),
                        std::move(fix), phase, on_host, in_passes});
}

constexpr MemoryPhase kPhases[] = {MemoryPhase::kAudit, MemoryPhase::kSpectrum,
                                   MemoryPhase::kDirection};

const char* phase_name(MemoryPhase phase) {
  switch (phase) {
    case MemoryPhase::kAudit:
      return "audit";
    case MemoryPhase::kSpectrum:
      return "spectrum";
    case MemoryPhase::kDirection:
      return "direction";
    default:
      return "";
  }
}

// Whether `part` is held during `phase` (not kBoth): a direction is built beside the audit's
// parts, but during no pass.
bool held_in(const MemoryPart& part, MemoryPhase phase) {
  if (part.on_host) return false;
  if (phase == MemoryPhase::kDirection) {
    return !part.in_passes && part.phase != MemoryPhase::kSpectrum;
  }
  return part.phase == MemoryPhase::kBoth || part.phase == phase;
}

// Vectors a Lanczos run holds on the device at its peak (analysis/krylov.h): with the basis
// there, its `steps` vectors and the product, then the `ritz` vectors formed from it; spilled to
// the host, the recurrence's two vectors and the staging buffer, then the Ritz vectors and a
// residual's product; without a basis, two vectors (each product added into the older one's
// memory), then the rerun that forms the Ritz vectors beside them.
int64_t lanczos_vectors(KrylovBasis basis, int64_t steps, int64_t ritz, bool gpu) {
  // On the CPU the host is the device: a basis there is counted.
  switch (basis == KrylovBasis::kHost && !gpu ? KrylovBasis::kDevice : basis) {
    case KrylovBasis::kDevice:
      return steps + std::max<int64_t>(1, ritz);
    case KrylovBasis::kHost:
      return std::max<int64_t>(3, ritz + 1);
    case KrylovBasis::kNone:
      break;
  }
  return 2 + ritz;
}

// The same for an eigen-solver asked for `top` and `bottom` pairs: Ritz vectors are formed for
// residual checks or to be kept; power iteration holds the pairs found, its vector and product;
// Spectra, a host solver, the vector copied to the device and its product, then the pairs.
int64_t eigen_vectors(const EigenOptions& e, int64_t top, int64_t bottom, bool gpu) {
  const int64_t ritz = e.check_residuals || e.keep_vectors ? top + bottom : 0;
  switch (e.method) {
    case EigenMethod::kPower:
      return top + 1;
    case EigenMethod::kSpectra:
      return std::max<int64_t>(2, ritz + 1);
    case EigenMethod::kLanczos:
      break;
  }
  return lanczos_vectors(e.basis, e.max_hvps, ritz, gpu);
}

// The solver vectors of a checkpoint's spectrum, in their phase: the most that any of the
// solvers switched on holds (they run one after another); eigenvectors kept for overlap are held
// through the audit too.
void add_spectrum_parts(const ProbeJob& job, double n, at::ScalarType p, MemoryPlan& plan) {
  const auto& sp = job.run.spectrum;
  if (!sp.any()) return;
  const at::ScalarType k = krylov_dtype(p, job.engine.vector_dtype);
  const double kb = static_cast<double>(element_bytes(k));
  const bool gpu = !c10::Device(plan.device).is_cpu();
  struct Solver {
    int64_t vectors;
    std::string what;
  };
  std::vector<Solver> solvers;
  const EigenOptions& e = sp.eigen;
  const std::string method = e.method == EigenMethod::kLanczos
                                 ? "Lanczos, basis " + to_string(e.basis)
                                 : to_string(e.method);
  if (sp.eigenvalues || sp.overlap) {
    solvers.push_back({eigen_vectors(e, e.top, sp.eigenvalues ? e.bottom : 0, gpu),
                       "the eigen-solver (" + method + ")"});
  }
  if (sp.precond_sharpness) {
    // The scaled operator's product: D x and A D x beside the solver's vectors.
    solvers.push_back(
        {eigen_vectors(e, 1, 0, gpu) + 2, "the preconditioned λ_max (" + method + ")"});
  }
  if (sp.density) {
    solvers.push_back(
        {lanczos_vectors(sp.density_options.basis, sp.density_options.steps, 0, gpu),
         "each spectral density run (basis " + to_string(sp.density_options.basis) + ")"});
  }
  if (sp.trace) {
    const TraceOptions& t = sp.trace_options;
    const int64_t sketch = t.method == TraceMethod::kHutchPlusPlus ? t.matvecs / 3 : 0;
    // Hutch++ on the device: the sketch and its QR factor; a probe and its product.
    solvers.push_back(
        {t.method == TraceMethod::kHutchPlusPlus && (t.basis == KrylovBasis::kDevice || !gpu)
             ? 2 * sketch + 2
             : 3,
         "the trace estimator (" + to_string(t.method) + ")"});
  }
  const Solver* most = &solvers.front();
  for (const Solver& s : solvers) {
    if (s.vectors > most->vectors) most = &s;
  }
  add_part(plan, "solver vectors", static_cast<double>(most->vectors) * n * kb,
           fmt::format("{} × {}: {}", most->vectors, count_times(n, k), most->what),
           most->vectors > 4 ? "fewer with {4} host, or none (λ_max and λ_min only)" : "",
           MemoryPhase::kSpectrum);
  if (sp.overlap) {
    add_part(plan, "eigenvectors (overlap)", static_cast<double>(e.top) * n * kb,
             fmt::format("{} × {}, kept through the units", e.top, count_times(n, k)), "",
             MemoryPhase::kAudit);
  }
}

// A pass of layer-wise recomputation (EngineOptions::recompute_layers): the activations between
// the stages (and, for an HVP, their tangents) and the graph of the largest stage (a layer, or the
// head with its logits) with its create_graph backward. An audit's block products are dotted as
// each stage's share appears, and a spectrum's shares are added into the solver's vector
// (CurvatureEngine::hvp_into): no product-sized tensor besides.
void add_layer_pass(MemoryPlan& plan, const TokenShape& t, int64_t tokens, at::ScalarType p,
                    bool exact) {
  const double pb = static_cast<double>(element_bytes(p));
  const Activations a = activations(t, static_cast<double>(tokens), p);
  const double layers = static_cast<double>(std::max<int64_t>(1, t.layers));
  const double layer = (a.linear + a.attention) / layers;
  const double stage = std::max(layer, a.logits);
  const double boundaries = (exact ? 2.0 : 1.0) * (layers + 1) * static_cast<double>(tokens) *
                            static_cast<double>(t.hidden) * pb;
  const double backward = exact ? 1.0 + kSecondBackwardShare : 1.0;
  add_part(plan, "layer-wise pass", backward * stage + boundaries,
           fmt::format("{} of {} tokens ≈ {} ({} × that with its backward), and {} between the {} "
                       "stages{}",
                       layer >= a.logits ? "a layer's graph" : "the head's graph", tokens,
                       format_bytes(static_cast<int64_t>(stage)), backward,
                       format_bytes(static_cast<int64_t>(boundaries)), t.layers + 2,
                       exact ? " (activations and tangents)" : ""),
           "lower it with {1} (fewer tokens per pass)", MemoryPhase::kBoth, false,
           /*in_passes=*/true);
}

// The shapes of a built-in model (its config from the job or the checkpoint), none for a
// TorchScript file; InvalidOption when layer-wise recomputation is asked of a model not computed
// in stages.
std::optional<TokenShape> model_shape(const ProbeJob& job, const Checkpoint& first) {
  const bool builtin =
      job.model.path.empty() || std::filesystem::path(job.model.path).extension() == ".json";
  std::optional<TokenShape> shape;
  std::string model = "a TorchScript model";
  if (builtin) {
    const ModelConfig config =
        job.model.path.empty() ? ModelConfig::from_json(first.model_config_json(), first.meta_file)
                               : ModelConfig::from_file(job.model.path);
    shape = token_shape(config);
    model = shape->model;
  }
  if (job.engine.recompute_layers && (!shape || shape->stages < 2)) {
    throw InvalidOption(
        fmt::format("{{0}}: {} is not computed in layer stages (the built-in transformers are)",
                    model),
        {{"EngineOptions.recompute_layers", ""}});
  }
  return shape;
}

}  // namespace

MemoryPlan plan_probe_job(const ProbeJob& job) {
  ProbeRun run(ProbeRunOptions(job.run));
  const CheckpointInfo& info = run.runs().front().chosen.front();
  const Checkpoint first = open_checkpoint(info, CheckpointParts::kModelOnly);
  double n = 0, largest_tensor = 0;
  for (const auto& entry : first.model_source->entries()) {
    n += static_cast<double>(entry.numel());
    largest_tensor = std::max(largest_tensor, static_cast<double>(entry.numel()));
  }
  const at::ScalarType p = job.model.init.dtype;
  const at::ScalarType v = job.engine.vector_dtype == at::ScalarType::Undefined
                               ? default_vector_dtype(p)
                               : job.engine.vector_dtype;
  const ProbeSet probe = job.data.load();
  MemoryPlan plan;
  plan.device = job.model.init.device;
  auto add = [&](std::string name, double bytes, std::string how, std::string fix = "",
                 MemoryPhase phase = MemoryPhase::kBoth) {
    add_part(plan, std::move(name), bytes, std::move(how), std::move(fix), phase);
  };
  const double pb = static_cast<double>(element_bytes(p)),
               vb = static_cast<double>(element_bytes(v));
  add("parameters", n * pb, count_times(n, p), "16 bits with {5}");
  // Layer-wise recomputation drops the cached gradient while a spectrum runs (its products form
  // their own).
  add("gradient", n * vb, count_times(n, v), "bfloat16 vectors with {3}",
      job.engine.recompute_layers ? MemoryPhase::kAudit : MemoryPhase::kBoth);
  add("direction u", n * vb, count_times(n, v), "bfloat16 vectors with {3}", MemoryPhase::kAudit);
  // The copies EngineOptions::host_copies moves off a GPU: on the host they are listed, not
  // counted; on the GPU their fix names the option.
  const bool gpu = !c10::Device(plan.device).is_cpu();
  const bool to_host = gpu && job.engine.host_copies;
  const std::string host_fix = gpu ? "in host memory with {6}" : "";
  const DirectionNeeds needs = direction_needs(job.run.directions);
  if (needs.next) {
    add_part(plan, "next checkpoint (delta)", n * pb, count_times(n, p), host_fix,
             MemoryPhase::kBoth, to_host);
  }
  // A rebuilt step reads each parameter's saved state when it takes that parameter's step
  // (Optimizer::step_from_saved): on a GPU one tensor's state is there at a time. On the CPU the
  // state files are read through a memory map whose pages count in the resident memory until
  // the step ends. Adam's preconditioner holds its second moment whole.
  if (needs.state) {
    const double held = gpu ? largest_tensor : n;
    add("optimizer state", 2 * held * vb,
        "2 × " + count_times(held, v) +
            (gpu ? " (an Adam-family state of the largest tensor: a rebuilt step reads one at a "
                   "time)"
                 : " (an Adam-family state, its files mapped into memory)"),
        "", MemoryPhase::kDirection);
  }
  if (job.run.spectrum.precond_sharpness) {
    add("Adam's second moment", n * vb, count_times(n, v) + " (the preconditioner, whole)", "",
        MemoryPhase::kSpectrum);
  }
  // L(θ + u), a routing change and finite-difference HVPs each save θ to restore it exactly,
  // one at a time.
  const bool exact = job.engine.hvp_method == HvpMethod::kExact;
  add_part(plan, "θ saved to restore it", n * pb, count_times(n, p), host_fix,
           exact ? MemoryPhase::kAudit : MemoryPhase::kBoth, to_host, /*in_passes=*/true);
  // The graphs: one per slice of every batch unless bounded.
  int64_t slices = 0;
  int64_t largest_slice = 0;
  for (size_t b = 0; b < probe.size(); ++b) {
    const Batch& batch = probe[b];
    const int64_t examples = batch.size();
    const int64_t size =
        job.engine.micro_batch > 0 ? std::min(job.engine.micro_batch, examples) : examples;
    slices += (examples + size - 1) / size;
    const int64_t tokens = size * (batch.inputs.dim() >= 2 ? batch.inputs.size(1) : 1);
    largest_slice = std::max(largest_slice, tokens);
  }
  // Each rank keeps the graphs of its share of the batches.
  const int64_t ranks = job.engine.communicator ? job.engine.communicator->world_size() : 1;
  slices = (slices + ranks - 1) / ranks;
  const bool by_layer = job.engine.recompute_layers;
  int64_t kept = exact && job.engine.reuse_graph && !by_layer ? slices : 0;
  if (job.engine.max_kept_graphs > 0) kept = std::min(kept, job.engine.max_kept_graphs);
  double per_graph = 0, second = 0;
  std::string graph_how = "TorchScript model: activations not estimated";
  if (const std::optional<TokenShape> t = model_shape(job, first)) {
    if (by_layer) add_layer_pass(plan, *t, largest_slice, p, exact);
    const Activations a = activations(*t, static_cast<double>(largest_slice), p);
    per_graph = a.total();
    second = kSecondBackwardShare * per_graph;
    graph_how = fmt::format("{} of {} tokens: activations ≈ {}", exact ? "a graph" : "a pass",
                            largest_slice, a.describe());
  }
  if (kept > 0) {
    add("kept graphs", static_cast<double>(kept) * (per_graph + n * pb),
        fmt::format("{} × ({} + its gradient {})", kept, graph_how,
                    format_bytes(static_cast<int64_t>(n * pb))),
        "lower it with {1} (smaller slices) or {2} (fewer kept)");
  }
  // One pass beyond the kept graphs: the second backward's intermediates (about a graph's
  // activations) and products, or a graph recomputed for each HVP.
  if (!by_layer) {
    add_part(plan, kept > 0 ? "second backward" : "recomputed graph",
             (kept > 0 ? second : per_graph + second) + n * pb,
             kept > 0 ? fmt::format("{:.2g} × a graph's activations, and {}", kSecondBackwardShare,
                                    count_times(n, p))
                      : fmt::format("{}, {:.2g} × that for the second backward, and {}", graph_how,
                                    kSecondBackwardShare, count_times(n, p)),
             "lower it with {1} (fewer tokens per pass)", MemoryPhase::kBoth, false,
             /*in_passes=*/true);
  }
  if (!exact) {
    add_part(plan, "finite differences", 3 * n * vb,
             "g(θ + hv), g(θ − hv) and their sum over batches: 3 × " + count_times(n, v), "",
             MemoryPhase::kBoth, false, /*in_passes=*/true);
  }
  add_spectrum_parts(job, n, p, plan);
  return plan;
}

int64_t MemoryPlan::phase_total(MemoryPhase phase) const {
  int64_t sum = 0;
  for (const auto& p : parts) {
    if (held_in(p, phase)) sum += p.bytes;
  }
  return sum;
}

int64_t MemoryPlan::total() const {
  int64_t most = 0;
  for (const MemoryPhase phase : kPhases) most = std::max(most, phase_total(phase));
  return most;
}

const MemoryPart& MemoryPlan::largest() const {
  if (parts.empty()) throw InvalidArgument("MemoryPlan: no parts");
  // The largest of the phase that makes the peak (the first of equals).
  MemoryPhase peak = MemoryPhase::kAudit;
  for (const MemoryPhase phase : kPhases) {
    if (phase_total(phase) > phase_total(peak)) peak = phase;
  }
  const MemoryPart* best = nullptr;
  for (const auto& p : parts) {
    if (!held_in(p, peak)) continue;
    if (best == nullptr || p.bytes > best->bytes) best = &p;
  }
  if (best == nullptr) throw InvalidArgument("MemoryPlan: no part on the device");
  return *best;
}

std::string MemoryPlan::describe() const {
  std::vector<MemoryPart> sorted = parts;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  std::string out =
      fmt::format("memory plan on {} (estimated before anything is allocated):\n", device);
  // Phases are named where some part is held in one phase only.
  const bool phased = std::any_of(parts.begin(), parts.end(), [](const MemoryPart& p) {
    return !p.on_host && p.phase != MemoryPhase::kBoth;
  });
  std::string host;
  for (const auto& p : sorted) {
    if (p.on_host) {
      host += fmt::format("  {:<26} {:>10}  {}\n", p.name, format_bytes(p.bytes), p.how);
      continue;
    }
    const std::string phase = phased && p.phase != MemoryPhase::kBoth
                                  ? fmt::format(" [{}]", phase_name(p.phase))
                              : phased && p.in_passes ? std::string(" [passes]")
                                                      : std::string();
    out += fmt::format("  {:<26} {:>10}  {}{}\n", p.name, format_bytes(p.bytes), p.how, phase);
  }
  if (phased) {
    for (const MemoryPhase phase : kPhases) {
      const bool own = phase == MemoryPhase::kAudit ||
                       std::any_of(parts.begin(), parts.end(),
                                   [&](const MemoryPart& p) { return p.phase == phase; });
      if (own) {
        out +=
            fmt::format("  {:<26} {:>10}\n", phase_name(phase), format_bytes(phase_total(phase)));
      }
    }
  }
  out += fmt::format("  {:<26} {:>10}\n", "total", format_bytes(total()));
  if (!host.empty()) out += "in host memory (not counted on " + device + "):\n" + host;
  return out;
}

void check_memory_budget(const MemoryPlan& plan, int64_t budget) {
  if (budget <= 0 || plan.total() <= budget) return;
  const MemoryPart& big = plan.largest();
  throw OutOfMemory(
      Error::literal(fmt::format("the run needs an estimated {} on {}, over its budget of ",
                                 format_bytes(plan.total()), plan.device)) +
          "{0}; the largest part is " +
          Error::literal(fmt::format("'{}' ({}: {})", big.name, format_bytes(big.bytes), big.how)) +
          (big.fix.empty() ? std::string() : "; " + big.fix),
      {{"ProbeJob.memory_budget", format_bytes(budget)},
       {"EngineOptions.micro_batch", ""},
       {"EngineOptions.max_kept_graphs", ""},
       {"EngineOptions.vector_dtype", ""},
       {"EigenOptions.basis", ""},
       {"ModelInit.dtype", ""},
       {"EngineOptions.host_copies", ""}});
}

}  // namespace curv
