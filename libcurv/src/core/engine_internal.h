// Private to the engine's sources (engine.cpp, engine_offset_passes.cpp, engine_coupling.cpp):
// the engine's state and the helpers they share.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>

#include <chrono>
#include <functional>
#include <vector>

#include "curv/core/engine.h"

namespace curv {
namespace engine_detail {

// Adds the seconds from construction to destruction to `total`.
class Stopwatch {
 public:
  explicit Stopwatch(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

extern const char* const kTwiceDifferentiableHint;

// Undefined gradients (parameters the loss does not depend on) become zeros.
ParamVector fill_undefined(ParamVector grads, const ParamVector& params);
// Adds w·t to the accumulator `acc` in `dtype` (t converted first when it is in another), where t
// is a fresh result that the caller may give away.
// The first term becomes the accumulator itself (scaled in place when nothing else holds t), so a
// sum over batches holds one parameter-sized buffer beside the current term, and a single batch
// none; 0 + w·t rounds as w·t, so the sum is the same to the bit.
void accumulate(at::Tensor& acc, at::Tensor t, double w, at::ScalarType dtype);
// Parameters no batch's term reached get zeros in `dtype`.
void fill_zeros(ParamVector& acc, const ParamVector& params, at::ScalarType dtype);
double machine_epsilon(at::ScalarType dtype);

// A run of consecutive examples of a probe batch and its share of the batch's loss.
struct Slice {
  Batch batch;
  double share = 1.0;
};

// `batch` in slices of at most `size` examples (one slice, the batch itself, when size is 0 or
// covers it). Integer targets: a slice's share is its count of targets other than kIgnoreIndex
// over the batch's (what a mean cross-entropy averages over); otherwise its examples over the
// batch's. Slices of share 0 (every target ignored) are left out.
std::vector<Slice> slices_of(const Batch& batch, int64_t size);

constexpr size_t kNoInput = static_cast<size_t>(-1);

// One linear map of a kept graph (LinearUse): x, where y sits in the graph and ∂L/∂y. An edge keeps
// no tensor's data alive; x and ∂L/∂y are saved by the graph for the weight's gradient anyway.
struct LinearGraph {
  at::Tensor input;
  torch::autograd::Edge output;
  at::Tensor output_grad;        // ∂L/∂y; undefined when the loss does not read y
  size_t input_grad = kNoInput;  // index into GradientGraph::input_grads, or kNoInput
  size_t weight = 0;
  size_t bias = LinearUse::kNoBias;
  bool transposed = false;
};

// A slice's first backward with create_graph: the parameters' gradients and, for the linear maps
// the objective listed, where ∂L/∂x of each distinct input that depends on the parameters sits in
// the graph (the second backward's R(x) arrives there).
struct GradientGraph {
  ParamVector grads;
  std::vector<LinearGraph> maps;
  std::vector<torch::autograd::Edge> input_grads;
  bool empty() const { return grads.empty(); }
  void clear() { *this = GradientGraph{}; }
};

// The parts u_l of a direction on disjoint parameter lists (blocks), as the block products read
// them: each parameter's block (or -1), u on the parameters' device and dtype (undefined off the
// blocks), the parameters covered and whether each u_l is nonzero.
struct BlockReader {
  std::vector<int64_t> block_of;
  ParamVector v;       // u · scale
  double scale = 1.0;  // CurvatureEngine::tangent_scale of u
  std::vector<size_t> covered;
  std::vector<bool> nonzero;
};

// One second backward of the block products: H d along `direction` (read on `support`; no product
// when it is empty), read as u_lᵀ (H d)_l on the blocks l ≥ first_block.
struct BlockProduct {
  const ParamVector* direction = nullptr;
  std::vector<size_t> support;
  size_t first_block = 0;
  double scale = 1.0;  // the direction is d · scale (tangent_scale)
};

// The first backward of `loss` toward `params`; with `with_graph`, with create_graph and toward
// the listed maps' outputs and inputs too (GradientGraph), else `linears` is not read.
GradientGraph first_backward(const at::Tensor& loss, const ParamVector& params,
                             std::vector<LinearUse> linears, bool with_graph);

// One slice's pass over a staged loss (Objective::loss_stages), holding one stage's graph at a
// time (layered_passes.cpp): its loss, its gradient when `want_gradient`, and along `v` (on the
// parameters' device and dtype; undefined entries are zero) its Hessian-vector product. Entries no
// stage reaches are undefined.
struct StagedPass {
  at::Tensor loss;
  ParamVector grads, hv;
  // Each parameter's lowest stage that the reverse sweep reached it in (loss_stages() when none):
  // where a later pass whose shares are wanted on some parameters only may stop.
  std::vector<size_t> first_stage;
};
// Where a staged pass hands each stage's share of the gradient or of the product, parameter by
// parameter, as the reverse sweep forms it, instead of summing them into StagedPass (a tied
// parameter gets one share per stage that reads it). The tensor lives only during the call.
struct StageSink {
  std::function<void(size_t, const at::Tensor&)> gradient, product;
  // Unless the gradient is wanted, the reverse sweep stops below this stage: the shares wanted
  // are all formed at or above it (StagedPass::first_stage of their parameters).
  size_t lowest_stage = 0;
};
StagedPass staged_pass(Objective& objective, const Batch& batch, const ParamVector& params,
                       const ParamVector* v, bool want_gradient, const StageSink* sink = nullptr);
// One slice's H v by a staged pass: every parameter's product, or with `targets` (ascending)
// only theirs (the other shares are dropped as they appear); with `gradient`, the slice's
// gradient there too, zeros where no stage reaches. With `sink`, the targets' shares go to its
// product as they appear and the returned product is all undefined.
ParamVector staged_slice_hvp(Objective& objective, const Batch& batch, const ParamVector& params,
                             const ParamVector& v, const std::vector<size_t>* targets,
                             ParamVector* gradient, const StageSink* sink = nullptr);
// One slice's block products by staged passes, one per product with a nonzero support:
// M(l, k) = u_lᵀ (H d_k)_l for blocks l ≥ products[k].first_block, and g·u_l in `first_order`
// when it is given, each dotted in float64 from the stages' shares as they are formed (no
// parameter-sized product or gradient is held). Counts the passes it ran in `passes`.
Eigen::MatrixXd staged_block_products(Objective& objective, const Batch& batch,
                                      const ParamVector& params, const BlockReader& reader,
                                      size_t blocks, const std::vector<BlockProduct>& products,
                                      Eigen::VectorXd* first_order, int64_t& passes);

}  // namespace engine_detail

struct CurvatureEngine::State {
  ParamVector params;  // the objective's live leaf tensors
  bool have_first_order = false;
  double loss = 0.0;
  std::vector<double> batch_losses;
  ParamVector grad;
  std::vector<std::vector<engine_detail::Slice>> slices;  // per batch (EngineOptions::micro_batch)
  // Per batch and slice: the create_graph gradient, or empty.
  std::vector<std::vector<engine_detail::GradientGraph>> kept;
  // The kept graphs belong to the current parameters (even when the budget kept none).
  bool graphs_current = false;
};

}  // namespace curv
