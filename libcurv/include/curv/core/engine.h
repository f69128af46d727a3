// CurvatureEngine: loss, gradient and Hessian-vector products of an Objective over a ProbeSet,
// by double backward. Each batch's create_graph gradient can be kept, so further HVPs at the same
// parameters cost only the second backward pass. Every call is counted and timed.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "curv/core/distributed.h"
#include "curv/core/error.h"
#include "curv/core/hvp_method.h"
#include "curv/core/objective.h"
#include "curv/core/param_space.h"
#include "curv/core/probe_set.h"

namespace curv {

namespace engine_detail {
struct BlockReader;
struct BlockProduct;
struct StageSink;
}  // namespace engine_detail

struct EngineOptions {
  // Keep each batch's create_graph gradient between HVPs at the same parameters. Off: every HVP
  // redoes the forward pass and both backward passes (less memory, ~1.5x slower per HVP).
  bool reuse_graph = true;
  // Keep the graphs of at most this many batches (the first ones); 0 keeps all. Bounds memory on
  // large probe sets: the remaining batches are recomputed on every HVP.
  int64_t max_kept_graphs = 0;
  // Keep a batch's graph only while the memory of the device the model lives on stays at or below
  // this many bytes; 0 = no bound. On the CPU that is the process's resident memory (host RAM, as
  // the kernel counts it); on a GPU, the bytes its tensors hold by the caching allocator's
  // statistics (device_memory in runtime.h; LibTorch 2.9 or later). Checked as each graph is
  // built (the graph that crosses the budget is released at once and no later batch keeps one)
  // and after each batch (or slice) of an HVP: once over the budget, every kept graph is released
  // and the allocator's free memory goes back to the system or the device. Batches without a
  // graph are recomputed on every HVP. A bound on what the graphs add, not on the memory an HVP
  // needs for itself; micro_batch bounds that.
  int64_t max_memory = 0;
  // The figure max_memory bounds, when a program measures memory its own way (a test simulating
  // a device, an allocator of its own); empty: device_memory(device).in_use.
  std::function<int64_t()> memory_probe;
  // Run each probe batch through the model in slices of at most this many examples (0 = the
  // whole batch at once) and sum the slices' terms: the batch's loss, gradient, HVP and
  // Gauss-Newton coupling are the same to rounding, and the graph an HVP builds or keeps is a
  // slice's, not the batch's. A slice weighs its share of the batch's targets other than
  // kIgnoreIndex (integer targets) or of its examples, so the sum is exact when a batch's loss is
  // the mean over those targets or examples, as every built-in model's is. Probe batches remain
  // the unit of the per-batch tables and standard errors.
  int64_t micro_batch = 0;
  // Hold one layer's graph at a time instead of the whole model's: each pass keeps the
  // activations between the layers (and, for an HVP, their tangents), then recomputes the layers
  // one by one from the last, carrying ∂L/∂x and its tangent down (layered_passes.cpp). The
  // same products to rounding, in about 1.4 times a recomputed whole-graph HVP's time; no graph
  // is kept between passes (reuse_graph is off). The block coupling and block rows form one
  // product per block, read as per-block dots while each layer's share appears, so neither a
  // parameter-sized product nor a batch's gradient is held. Needs a model computed in stages
  // (Objective::loss_stages: the built-in transformers).
  bool recompute_layers = false;
  HvpMethod hvp_method = HvpMethod::kExact;
  // The dtype of the vectors the engine returns (gradients, HVPs) and sums batches and slices
  // in; Undefined: default_vector_dtype of the parameters' (theirs, float32 for 16-bit
  // parameters). Vectors handed in may have any floating dtype: each pass converts them to the
  // parameters' dtype where they enter the model (a 16-bit HVP is taken along the 16-bit
  // rounding of v), and every dot product, norm and per-block sum accumulates in float64.
  at::ScalarType vector_dtype = at::ScalarType::Undefined;
  // Finite-difference step as the norm of the parameter perturbation ‖h v‖; 0 picks
  // fd_step_for(θ): for float32 and float64 parameters cbrt(machine epsilon) · max(1, RMS(θ)),
  // which balances truncation against rounding error; 16-bit parameters a norm that moves each
  // coordinate by half of θ's spacing on average, 0.5 · ε · RMS(θ) · sqrt(n) (measured best on
  // the built-in models: docs/performance.md).
  double fd_step = 0.0;
  // Keep the copy of θ that the engine saves to restore it after an excursion (L(θ + u), a
  // routing change, finite-difference HVPs) in host memory when the parameters live on a GPU:
  // one parameter-sized tensor less on the device, for a copy over the bus at each save and
  // restore (each batch's gradient of a finite-difference HVP restores θ, so there it is one per
  // batch and side). No effect on the CPU.
  bool host_copies = false;
  // Stop with NumericalError when a loss, gradient or HVP holds NaN or Inf.
  bool check_finite = true;
  // Data parallelism (curv/core/distributed.h): each rank runs its own contiguous share of the
  // probe batches, balanced by examples, and every result is summed over the ranks in float64, so
  // every rank holds the whole probe set's loss, gradient and HVPs. Null: one process.
  std::shared_ptr<Communicator> communicator;

  void validate() const;
};

struct EngineCounters {
  int64_t forwards = 0;            // forward passes (of a batch, or of a slice: micro_batch)
  int64_t backwards = 0;           // first-order backward passes (with or without create_graph)
  int64_t second_backwards = 0;    // backward passes through a gradient graph (one per slice-HVP)
  int64_t hvps = 0;                // Hessian-vector products over the whole probe set
  int64_t gradients = 0;           // gradients over the whole probe set
  int64_t graphs_over_budget = 0;  // graphs released because of EngineOptions::max_memory
  double seconds = 0.0;            // wall time inside the engine
  std::string brief() const;
};

// One probe batch's share of a pass, handed to a BatchObserver before it enters the weighted sum
// over batches: the per-batch terms behind standard errors and paired comparisons. The tensors are
// detached and live only during the call.
struct BatchTerms {
  size_t batch = 0;
  double weight = 0.0;                    // w_b = N_b / N
  const ParamVector* gradient = nullptr;  // g_b = ∇L_b(θ)
  const ParamVector* hvp = nullptr;       // H_b v, unweighted; an undefined tensor is zero
};
using BatchObserver = std::function<void(const BatchTerms&)>;

// One probe batch's share of CurvatureEngine::coupling, unweighted: g_b·u_l per block and the
// symmetric C_b with C_b(l, m) = u_lᵀ H_b u_m.
struct CouplingTerms {
  size_t batch = 0;
  double weight = 0.0;  // w_b = N_b / N
  const Eigen::VectorXd* first_order = nullptr;
  const Eigen::MatrixXd* coupling = nullptr;
};
using CouplingObserver = std::function<void(const CouplingTerms&)>;

// The finite-difference step ‖h v‖ EngineOptions::fd_step = 0 picks for parameters θ.
double fd_step_for(const ParamVector& theta);

class CurvatureEngine {
 public:
  CurvatureEngine(Objective& objective, ProbeSet probe, EngineOptions options = {});
  ~CurvatureEngine();
  CurvatureEngine(const CurvatureEngine&) = delete;
  CurvatureEngine& operator=(const CurvatureEngine&) = delete;

  Objective& objective() { return objective_; }
  const ParamSpace& space() const;
  const ProbeSet& probe() const { return probe_; }
  const EngineOptions& options() const { return options_; }
  // The device the model's parameters live on, where every pass runs.
  const c10::Device& device() const { return device_; }
  // The parameters' dtype, and the dtype of the vectors the engine returns
  // (EngineOptions::vector_dtype, resolved).
  at::ScalarType parameter_dtype() const;
  at::ScalarType vector_dtype() const { return vector_dtype_; }

  // Detached copy of the current parameters θ.
  ParamVector parameters() const;
  // Moves the model to θ: copies values in and drops every cached quantity.
  void set_parameters(const ParamVector& theta);
  // The model's parameters were written in place (a checkpoint read straight into them, io's
  // fill_parameters): drops every cached quantity, as set_parameters does.
  void parameters_changed();

  double loss();                  // L(θ), cached until the parameters change
  const ParamVector& gradient();  // ∇L(θ), cached likewise
  // L(θ) without the gradient: the cached loss when the gradient pass has run, else one forward
  // per batch with no graph (for a number that needs the loss alone; nothing is cached).
  double forward_loss();
  // L_b(θ) of every probe batch (L = Σ_b w_b L_b), cached with the loss.
  const std::vector<double>& batch_losses();
  // L(θ + u) on the same probe set; θ is restored exactly. With `batch_losses`, also L_b(θ + u).
  double loss_at(const ParamVector& u, std::vector<double>* batch_losses = nullptr);
  // L at a point given as parameters (a saved checkpoint's θ_next, where the delta lands): the
  // same passes as loss_at(θ_next − θ) without the rounding of θ + (θ_next − θ), so the value is
  // the one forward_loss() gives once the engine is moved there. θ is restored exactly.
  double loss_at_point(const ParamVector& point, std::vector<double>* batch_losses = nullptr);
  // The share of a mixture of experts' routing choices (a token at a routed layer) whose set of
  // experts differs between θ and θ + u (or `point`), over the probe set: where it is not 0 the
  // loss crosses routing boundaries the Hessian, taken with the routing held fixed, does not see.
  // NaN for a model without routing (Objective::expert_choices). θ is restored exactly.
  double routing_change(const ParamVector& u);
  double routing_change_to_point(const ParamVector& point);

  // H v by options().hvp_method; `observer`, when given, sees every batch's g_b and H_b v.
  ParamVector hvp(const ParamVector& v, const BatchObserver& observer = {});
  // H v for a v that is zero outside the parameters `support` (indices into space(), e.g. one
  // block's): v's other entries are not read and may be undefined. The exact method starts the
  // second backward from those parameters' gradients only, so autograd skips every path that
  // cannot contribute; the result equals hvp() of the zero-padded v.
  ParamVector hvp(const ParamVector& v, const std::vector<size_t>& support,
                  const BatchObserver& observer = {});
  // (H v) on the parameters `targets` only, for a v that is zero outside `support`; the result
  // (and what an observer sees) is zero elsewhere. The exact method differentiates toward
  // `targets` alone, so autograd also skips every product that reaches only other parameters:
  // one layer's part of H u_m needs no backward below that layer, nor any other weight's
  // gradient.
  ParamVector hvp(const ParamVector& v, const std::vector<size_t>& support,
                  const std::vector<size_t>& targets, const BatchObserver& observer = {});
  // The product hvp(v, support, targets) gives, written into `out` on the targets (overwriting
  // it, or with `add` added to what it holds): out[i] a floating tensor of parameter i's shape
  // on device(), in any dtype (a view of a solver's flat vector, which then receives H v in its
  // own dtype with no copy in between); entries off the targets are not read and may be
  // undefined. Under layer-wise recomputation each stage's share is added to `out` as it
  // appears: no other product-sized tensor is held.
  void hvp_into(const ParamVector& v, ParamVector& out, bool add = false);
  void hvp_into(const ParamVector& v, const std::vector<size_t>& support,
                const std::vector<size_t>& targets, ParamVector& out, bool add = false);
  ParamVector hvp_exact(const ParamVector& v);
  // Central difference per batch, (g_b(θ + hv) − g_b(θ − hv)) / 2h; `step` overrides
  // options().fd_step for this call. An observer costs one more gradient per batch (g_b at θ).
  ParamVector hvp_finite_difference(const ParamVector& v, double step = 0.0,
                                    const BatchObserver& observer = {});

  // The coupling matrix of the parts u_l of u on the disjoint parameter lists `blocks` (indices
  // into space()): C_lm = u_lᵀ H u_m = Σ_b w_b C_b, symmetric, with zero rows and columns where
  // u_l is zero. The exact method forms block m's product on each batch's graph toward blocks
  // l ≥ m only (C_ml = C_lm), all blocks on one batch before the next. For the linear maps the
  // objective lists (LinearUse), u_lᵀ (H u_m)_l is read from the map's input x and output y
  // instead of the weight's second derivative: with z = x U_lᵀ and a = (∂L/∂y) U_l,
  // u_lᵀ (H u_m)_l = ⟨R(∂L/∂y), z⟩ + ⟨R(x), a⟩, where R is the derivative along u_m and the
  // second backward yields R(∂L/∂y) at y and R(x) at ∂L/∂x; it then does no product toward any
  // weight, about half of each block's matrix products. Finite differences: one product per
  // block with u_m ≠ 0. `observer`, when given, sees every batch's terms.
  Eigen::MatrixXd coupling(const ParamVector& u, const std::vector<std::vector<size_t>>& blocks,
                           const CouplingObserver& observer = {});
  // u_lᵀ (H w)_l for every block l, of a direction w on the parameters the blocks cover: the row
  // sums of the coupling when w = u (uᵀHu is their sum), a sample of its randomized diagonal when
  // w = Σ_l s_l u_l. One second backward per batch toward the blocks' parameters (for a single
  // product, reading the linear maps would cost what it saves); finite differences: one HVP. The
  // observer's CouplingTerms::coupling is each batch's column (L×1).
  Eigen::VectorXd block_row(const ParamVector& u, const std::vector<std::vector<size_t>>& blocks,
                            const ParamVector& w, const CouplingObserver& observer = {});

  // The Gauss-Newton coupling over the probe set, G_lm = (J u_l)ᵀ H_out (J u_m) with u_l the part
  // of u on supports[l] (core/gauss_newton.h): Σ_b w_b G_b. One forward pass and one JVP per
  // support and batch; `observer`, when given, sees each batch's unweighted G_b. ModelError for
  // objectives without logits (Objective::logits).
  Eigen::MatrixXd gauss_newton(
      const ParamVector& u, const std::vector<std::vector<size_t>>& supports,
      const std::function<void(size_t batch, const Eigen::MatrixXd& g_b)>& observer = {});

  // The ranks the probe set is split over (a single process unless EngineOptions.communicator).
  Communicator& communicator() const { return *communicator_; }
  // Whether probe batch b is this rank's: only its own batches reach a BatchObserver.
  bool owns_batch(size_t b) const { return b >= first_batch_ && b < last_batch_; }
  // Sums `n` values over the ranks, in place: for per-batch tables that observers filled on each
  // rank's own batches, zero elsewhere. A collective: every rank calls it in the same order.
  void sum_over_ranks(double* data, size_t n);

  // Frees the kept gradient graphs; loss and gradient stay cached.
  void release_graphs();
  // Frees the cached loss and gradient too (the next call that needs them computes them again):
  // a parameter-sized tensor less while passes that need no gradient run (layer-wise products,
  // EngineOptions::recompute_layers, form their own).
  void release_first_order();
  size_t kept_graphs() const;

  const EngineCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

 private:
  struct State;
  // What a pass over the probe set computes, for error messages.
  enum class Pass { kFirstOrder, kLoss, kHvp, kGradientAtOffset, kLossAt, kGaussNewton };
  static const char* pass_name(Pass pass);
  // The one loop over the probe batches that every operation runs: body(b, w_b) does batch b's
  // work (w_b = N_b / N) for this rank's batches; a failure inside the model becomes one
  // ModelError naming the operation and the batch, raised on every rank.
  void for_each_batch(Pass pass, const std::function<void(size_t, double)>& body);
  // The OutOfMemory error for an allocation that failed in `pass` of `batch`; releases the kept
  // graphs and the allocator's cached memory.
  OutOfMemory out_of_memory(Pass pass, size_t batch, const std::exception& e);
  // x ← Σ_ranks x and scalars likewise, through one float64 buffer; undefined tensors count as
  // zero. Nothing happens with one process.
  void reduce(ParamVector& x, std::vector<double>& scalars);
  void compute_first_order(bool keep_graphs);
  bool keep_graphs_by_default() const;
  // Batch b's gradient at θ + scale · offset (θ itself when offset is null), θ written from
  // `saved` first; the caller restores θ.
  ParamVector batch_gradient_at(size_t b, const ParamVector& saved, const ParamVector* offset,
                                double scale = 1.0);
  // A copy of θ to restore it from: on the host with EngineOptions::host_copies, else beside θ.
  ParamVector saved_parameters() const;
  // θ ← saved, exactly (no grad; the kept graphs' version counters untouched).
  void restore_parameters(const ParamVector& saved);
  // Batch b's loss (without a graph) as the share-weighted sum over its slices.
  double batch_loss_value(size_t b);
  // The loss with the parameters moved by `move` (called per parameter on its data, no grad);
  // `where` names the point in the error for a NaN loss.
  double loss_away(const std::function<void(size_t, at::Tensor&)>& move,
                   std::vector<double>* batch_losses, const std::function<std::string()>& where);
  double routing_away(const std::function<void(size_t, at::Tensor&)>& move);
  void check(const ParamVector& x, const char* what) const;
  // EngineOptions::max_memory during an HVP: past it, releases every kept graph.
  void release_graphs_over_budget();
  // The figure EngineOptions::max_memory bounds (its memory_probe, else the device's in_use).
  int64_t memory_in_use() const;
  bool over_memory_budget() const;
  // hvp_exact for v on the parameters in `support`, the product on those in `targets` (all when
  // null); written into `into` (hvp_into, added to it with `add`) when given, and nothing
  // returned.
  ParamVector hvp_exact_on(const ParamVector& v, const std::vector<size_t>* support,
                           const std::vector<size_t>* targets, const BatchObserver& observer,
                           ParamVector* into, bool add = false);
  // Slice k of batch b's H v for a prepared v (on the parameters, undefined off `support`), on
  // `targets` (all when null; `inputs` are their tensors): by a layer-wise pass, whose shares go to
  // `sink` when given, or by a second backward of the slice's kept or recomputed gradient graph.
  // `gradient`, when given, receives the slice's gradient.
  ParamVector slice_hvp(size_t b, size_t k, const ParamVector& v,
                        const std::vector<size_t>& support, const std::vector<size_t>* targets,
                        const std::vector<at::Tensor>& inputs, ParamVector* gradient,
                        const engine_detail::StageSink* sink);
  // out ← Σ_ranks out on `indices`, in place (reduce() for a caller's buffer).
  void reduce_into(ParamVector& out, const std::vector<size_t>& indices);
  // Before a product is added into `out` on `indices`: zeroed to overwrite it; to add to it, kept
  // on rank 0 and zeroed on the others, whose sum over the ranks then adds it once.
  void prepare_into(ParamVector& out, const std::vector<size_t>& indices, bool add);
  // u's parts on `blocks`, validated (`what` names the call in errors).
  engine_detail::BlockReader read_blocks(const ParamVector& u,
                                         const std::vector<std::vector<size_t>>& blocks,
                                         const char* what) const;
  // x[i] checked against parameter i's shape, times `scale`, on its device and dtype.
  at::Tensor on_parameter(const ParamVector& x, size_t i, const char* what,
                          double scale = 1.0) const;
  // The power of two a direction is multiplied by before an exact HVP of a float16 model, so
  // that its largest entry on `indices` is in (1/2, 1] (the product is divided by it after):
  // the second backward's tangents of a small direction would otherwise fall below float16's
  // normal range (6.1e-5), as gradients without loss scaling do. 1 for other dtypes.
  double tangent_scale(const ParamVector& x, const std::vector<size_t>& indices) const;
  // The exact block products batch by batch: M(l, k) = u_lᵀ (H d_k)_l over the probe set, with
  // the lower triangle mirrored when `symmetric` (coupling()).
  Eigen::MatrixXd block_products(const engine_detail::BlockReader& reader,
                                 const std::vector<std::vector<size_t>>& blocks,
                                 const std::vector<engine_detail::BlockProduct>& products,
                                 bool symmetric, const CouplingObserver& observer);
  // coupling() by per-block finite-difference products.
  Eigen::MatrixXd coupling_finite_difference(const ParamVector& u,
                                             const std::vector<std::vector<size_t>>& blocks,
                                             const std::vector<bool>& nonzero,
                                             const CouplingObserver& observer);
  // `indices` checked against the parameters, sorted and unique; `what` names them in errors.
  std::vector<size_t> parameter_subset(const std::vector<size_t>& indices, const char* what) const;

  Objective& objective_;
  ProbeSet probe_;
  EngineOptions options_;
  c10::Device device_ = c10::Device(c10::kCPU);
  at::ScalarType vector_dtype_ = at::kFloat;
  std::shared_ptr<Communicator> communicator_;
  size_t first_batch_ = 0, last_batch_ = 0;  // this rank's batches
  EngineCounters counters_;
  std::unique_ptr<State> state_;
};

}  // namespace curv
