#include "session.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "curv/core/error.h"
#include "curv/core/linear_operator.h"

namespace curv::python {
namespace {

// (batch, row) pairs of batch b's examples: what the engine slices and the evaluator reads.
at::Tensor rows_of(int64_t b, int64_t n) {
  at::Tensor rows = at::empty({n, 2}, at::kLong);
  rows.select(1, 0).fill_(b);
  rows.select(1, 1).copy_(at::arange(n, at::kLong));
  return rows;
}

}  // namespace

Session::Session(py::object evaluator, const std::vector<std::string>& names, ParamVector params,
                 const std::vector<at::Tensor>& targets, bool has_logits, std::string description,
                 const std::string& structure_json, SessionOptions options)
    : options_(std::move(options)) {
  objective_ =
      std::make_unique<PythonObjective>(std::move(evaluator), names, std::move(params), has_logits,
                                        std::move(description), structure_json);
  if (targets.empty()) throw InvalidArgument("the probe set holds no batch");
  std::vector<Batch> batches;
  const c10::Device device = objective_->parameters().front().device();
  for (size_t b = 0; b < targets.size(); ++b) {
    const at::Tensor& t = targets[b];
    if (!t.defined() || t.dim() == 0 || t.size(0) == 0) {
      throw InvalidArgument(fmt::format("probe batch {} has no examples", b));
    }
    batches.push_back({rows_of(static_cast<int64_t>(b), t.size(0)).to(device), t.to(device)});
  }
  probe_ = ProbeSet(std::move(batches));
  options_.engine.validate();
  engine_ = std::make_unique<CurvatureEngine>(*objective_, probe_, options_.engine);
  const ParamSpace& space = objective_->space();
  blocks_ = options_.block_groups.empty()
                ? BlockPartition::by_rule(space, objective_->structure(), options_.block_rule)
                : BlockPartition::by_regex(space, options_.block_groups);
  versions_ = versions();
}

Session::~Session() {
  py::gil_scoped_release release;
  engine_.reset();
}

std::vector<int64_t> Session::versions() const {
  std::vector<int64_t> out;
  for (const auto& p : objective_->parameters()) out.push_back(p._version());
  return out;
}

void Session::refresh() {
  if (versions() != versions_) engine_->parameters_changed();
}

double Session::loss() {
  return run([&] { return engine_->loss(); });
}

ParamVector Session::gradient() {
  return run([&] { return clone(engine_->gradient()); });
}

ParamVector Session::hvp(const ParamVector& v) {
  return run([&] { return engine_->hvp(v); });
}

TaylorResult Session::audit(const ParamVector& u, const TaylorOptions& options) {
  return run([&] { return taylor_audit(*engine_, u, blocks_, options); });
}

WithinReport Session::within(const ParamVector& u, WithinOptions options) {
  return run([&] {
    const ModelStructure structure = objective_->structure();
    if (options.n_head == 0) options.n_head = structure.n_head;
    if (options.n_kv_head == 0 && options.n_head == structure.n_head) {
      options.n_kv_head = structure.n_kv_head;
    }
    return within_block(*engine_, u, options);
  });
}

std::vector<BucketResult> Session::token_buckets(const ParamVector& u,
                                                 const TokenBucketOptions& buckets,
                                                 const TaylorOptions& options) {
  return run([&] {
    const TokenBuckets made = make_token_buckets(buckets, probe_);
    TokenBucketAudit audit(*objective_, probe_, made, options_.engine);
    return audit.audit(u, blocks_, options);
  });
}

EigenResult Session::eigenvalues(const EigenOptions& options) {
  return run([&] {
    HessianOperator op(*engine_);
    return extreme_eigenpairs(op, options);
  });
}

TraceResult Session::trace(const TraceOptions& options) {
  return run([&] {
    HessianOperator op(*engine_);
    return estimate_trace(op, options);
  });
}

DensityResult Session::density(const DensityOptions& options) {
  return run([&] {
    HessianOperator op(*engine_);
    return spectral_density(op, options);
  });
}

}  // namespace curv::python
