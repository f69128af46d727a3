#include "curv/analysis/taylor.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/statistics.h"

namespace curv {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

CouplingMode parse_coupling_mode(const std::string& text) {
  if (text == "full") return CouplingMode::kFull;
  if (text == "random") return CouplingMode::kRandomized;
  if (text == "none") return CouplingMode::kNone;
  throw InvalidArgument(fmt::format("coupling '{}': expected full, random or none", text));
}

std::string to_string(CouplingMode mode) {
  switch (mode) {
    case CouplingMode::kFull:
      return "full";
    case CouplingMode::kRandomized:
      return "random";
    case CouplingMode::kNone:
      return "none";
  }
  return "?";
}

void TaylorOptions::validate() const {
  if (coupling == CouplingMode::kRandomized && coupling_samples < 2) {
    throw InvalidOption("{0} must be >= 2",
                        {{"TaylorOptions.coupling_samples", fmt::format("{}", coupling_samples)}});
  }
  for (double eta : step_multipliers) {
    if (!std::isfinite(eta)) {
      throw InvalidOption(fmt::format("{{0}} holds {}", eta),
                          {{"TaylorOptions.step_multipliers", ""}});
    }
  }
}

std::string to_string(AuditStatus status) {
  switch (status) {
    case AuditStatus::kComplete:
      return "complete";
    case AuditStatus::kZeroDirection:
      return "zero_direction";
  }
  return "?";
}

std::string TaylorResult::brief() const {
  return fmt::format(
      "loss {:.5g}, NDS {:.5g} ± {:.2g}, predicted {:.4g} ± {:.2g}, realized {:.4g} ± {:.2g}, "
      "ρ_within {:.3g}, {} HVPs, {:.2f} s",
      loss, nds, nds_stderr, predicted, predicted_stderr, realized, realized_stderr, rho_within,
      hvps, seconds);
}

namespace {

std::vector<double> column(const Eigen::MatrixXd& m, Eigen::Index j) {
  std::vector<double> out(static_cast<size_t>(m.rows()));
  for (Eigen::Index b = 0; b < m.rows(); ++b) out[static_cast<size_t>(b)] = m(b, j);
  return out;
}

// x + scale·y per batch.
std::vector<double> combine(const std::vector<double>& x, double scale,
                            const std::vector<double>& y) {
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size(); ++b) out[b] = x[b] + scale * y[b];
  return out;
}

std::vector<double> times(const std::vector<double>& x, double scale) {
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size(); ++b) out[b] = scale * x[b];
  return out;
}

// Standard errors of every value of `r` from its per-batch terms.
void fill_stderrs(TaylorResult& r, bool realized) {
  const TaylorBatches& t = r.batches;
  const auto& w = t.weight;
  const double u_sq = r.update_norm * r.update_norm;
  r.loss_stderr = batch_stderr(t.loss, w);
  r.first_order_stderr = batch_stderr(t.first_order, w);
  r.curvature_stderr = batch_stderr(t.curvature, w);
  r.predicted_stderr = batch_stderr(combine(t.first_order, 0.5, t.curvature), w);
  r.realized_stderr = realized ? batch_stderr(t.realized, w) : kNaN;
  r.nds_stderr = r.curvature_stderr / u_sq;
  const bool have_within = r.coupling_mode != CouplingMode::kNone;
  r.s_within_stderr = have_within ? batch_stderr(t.within, w) / u_sq : kNaN;
  r.s_cross_stderr =
      have_within ? batch_stderr(combine(t.curvature, -1.0, t.within), w) / u_sq : kNaN;
  r.rho_within_stderr = have_within ? ratio_stderr(t.within, t.curvature, w) : kNaN;
  r.eta_star_stderr =
      std::isnan(r.eta_star) ? kNaN : ratio_stderr(times(t.first_order, -1.0), t.curvature, w);
  for (size_t l = 0; l < r.blocks.size(); ++l) {
    auto& b = r.blocks[l];
    const auto j = static_cast<Eigen::Index>(l);
    const auto first = column(t.block_first_order, j);
    const auto row = column(t.block_row_sum, j);
    b.first_order_stderr = batch_stderr(first, w);
    b.row_sum_stderr = batch_stderr(row, w);
    b.predicted_stderr = batch_stderr(combine(first, 0.5, row), w);
    b.curvature_stderr = have_within ? batch_stderr(column(t.block_curvature, j), w) : kNaN;
    b.nds_stderr = b.sq_norm > 0.0 ? b.curvature_stderr / b.sq_norm : kNaN;
  }
  for (size_t k = 0; k < r.multipliers.size(); ++k) {
    auto& m = r.multipliers[k];
    m.predicted_stderr =
        batch_stderr(combine(times(t.first_order, m.eta), 0.5 * m.eta * m.eta, t.curvature), w);
  }
}

// uᵀGu over the probe set and its residual uᵀHu − uᵀGu, with per-block G_ll when `per_block`.
void gauss_newton_split(CurvatureEngine& engine, const ParamVector& u, const BlockPartition& blocks,
                        bool per_block, TaylorResult& r) {
  TaylorBatches& t = r.batches;
  const size_t B = t.size(), L = blocks.size();
  const double u_sq = r.update_norm * r.update_norm;
  std::vector<std::vector<size_t>> supports;
  std::vector<size_t> block_of_support;  // blocks with u_l ≠ 0 (the others have G_ll = 0)
  if (per_block) {
    for (size_t l = 0; l < L; ++l) {
      if (r.blocks[l].sq_norm == 0.0) continue;
      supports.push_back(blocks[l].params);
      block_of_support.push_back(l);
    }
  } else {
    std::vector<size_t> all(u.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    supports.push_back(std::move(all));
  }
  t.ggn.assign(B, 0.0);
  t.block_ggn =
      Eigen::MatrixXd::Constant(static_cast<Eigen::Index>(B), static_cast<Eigen::Index>(L), kNaN);
  if (per_block) t.block_ggn.setZero();
  const Eigen::MatrixXd g =
      engine.gauss_newton(u, supports, [&](size_t b, const Eigen::MatrixXd& g_b) {
        t.ggn[b] = g_b.sum();
        for (size_t k = 0; k < block_of_support.size(); ++k) {
          const auto i = static_cast<Eigen::Index>(k);
          t.block_ggn(static_cast<Eigen::Index>(b),
                      static_cast<Eigen::Index>(block_of_support[k])) = g_b(i, i);
        }
      });
  engine.sum_over_ranks(t.ggn.data(), t.ggn.size());
  engine.sum_over_ranks(t.block_ggn.data(), static_cast<size_t>(t.block_ggn.size()));
  const auto& w = t.weight;
  r.ggn_curvature = g.sum();
  r.ggn_nds = r.ggn_curvature / u_sq;
  r.residual_curvature = r.curvature - r.ggn_curvature;
  r.residual_nds = r.residual_curvature / u_sq;
  r.ggn_nds_stderr = batch_stderr(t.ggn, w) / u_sq;
  r.residual_nds_stderr = batch_stderr(combine(t.curvature, -1.0, t.ggn), w) / u_sq;
  if (!per_block) return;
  std::vector<double> g_ll(L, 0.0);  // 0 for blocks with u_l = 0
  for (size_t k = 0; k < block_of_support.size(); ++k) {
    const auto i = static_cast<Eigen::Index>(k);
    g_ll[block_of_support[k]] = g(i, i);
  }
  for (size_t l = 0; l < L; ++l) {
    auto& b = r.blocks[l];
    const auto per_batch = column(t.block_ggn, static_cast<Eigen::Index>(l));
    b.ggn_curvature = g_ll[l];
    b.ggn_nds = b.sq_norm > 0.0 ? b.ggn_curvature / b.sq_norm : kNaN;
    b.ggn_curvature_stderr = batch_stderr(per_batch, w);
    b.residual_curvature = b.curvature - b.ggn_curvature;
    b.residual_curvature_stderr =
        r.coupling_mode == CouplingMode::kNone
            ? kNaN
            : batch_stderr(
                  combine(column(t.block_curvature, static_cast<Eigen::Index>(l)), -1.0, per_batch),
                  w);
  }
}

// The audit of u = 0, exactly and without passes: every term that is linear or quadratic in u is
// 0 (per batch and per block too), every ratio by ‖u‖² or uᵀHu is NaN.
TaylorResult zero_direction_audit(CurvatureEngine& engine, const BlockPartition& blocks,
                                  const TaylorOptions& options) {
  TaylorResult r;
  r.status = AuditStatus::kZeroDirection;
  r.coupling_mode = options.coupling;
  r.loss = engine.loss();
  const size_t L = blocks.size();
  const auto Le = static_cast<Eigen::Index>(L);
  TaylorBatches& t = r.batches;
  t.loss = engine.batch_losses();
  const size_t B = t.loss.size();
  const auto Be = static_cast<Eigen::Index>(B);
  t.weight.resize(B);
  for (size_t b = 0; b < B; ++b) t.weight[b] = engine.probe().weight(b);
  const bool have_within = options.coupling != CouplingMode::kNone;
  t.first_order.assign(B, 0.0);
  t.curvature.assign(B, 0.0);
  t.realized.assign(B, options.realized ? 0.0 : kNaN);
  t.within.assign(B, have_within ? 0.0 : kNaN);
  t.block_first_order = Eigen::MatrixXd::Zero(Be, Le);
  t.block_curvature =
      have_within ? Eigen::MatrixXd::Zero(Be, Le).eval() : Eigen::MatrixXd::Constant(Be, Le, kNaN);
  t.block_row_sum = Eigen::MatrixXd::Zero(Be, Le);
  t.ggn.assign(B, options.ggn ? 0.0 : kNaN);
  t.block_ggn = options.ggn_blocks ? Eigen::MatrixXd::Zero(Be, Le).eval()
                                   : Eigen::MatrixXd::Constant(Be, Le, kNaN);
  r.realized = options.realized ? 0.0 : kNaN;
  r.loss_after = options.realized ? r.loss : kNaN;
  r.nds = r.eta_star = r.s_within = r.s_cross = r.rho_within = kNaN;
  if (options.coupling == CouplingMode::kFull) r.coupling = Eigen::MatrixXd::Zero(Le, Le);
  r.blocks.resize(L);
  for (size_t l = 0; l < L; ++l) {
    auto& b = r.blocks[l];
    b.name = blocks[l].name;
    b.curvature = have_within ? 0.0 : kNaN;
    b.nds = kNaN;
    if (options.ggn_blocks) {
      b.ggn_curvature = 0.0;
      b.ggn_curvature_stderr = 0.0;
      b.residual_curvature = have_within ? 0.0 : kNaN;
      b.residual_curvature_stderr = options.coupling == CouplingMode::kFull ? 0.0 : kNaN;
    }
  }
  for (double eta : options.step_multipliers) {
    MultiplierTerms m;
    m.eta = eta;
    r.multipliers.push_back(m);
  }
  if (options.ggn) r.ggn_curvature = r.residual_curvature = 0.0;
  fill_stderrs(r, options.realized);
  return r;
}

// Full coupling: the matrix C_lm = u_lᵀ(H u_m)_l (CurvatureEngine::coupling, which forms block
// m's product toward blocks l ≥ m only) with each batch's first-order terms, diagonal and row sums.
void full_coupling(CurvatureEngine& engine, const ParamVector& u,
                   const std::vector<std::vector<size_t>>& supports, TaylorResult& r) {
  TaylorBatches& t = r.batches;
  t.block_curvature.setZero();
  r.coupling = engine.coupling(u, supports, [&](const CouplingTerms& c) {
    const auto b = static_cast<Eigen::Index>(c.batch);
    t.block_first_order.row(b) = c.first_order->transpose();
    t.block_curvature.row(b) = c.coupling->diagonal().transpose();
    t.block_row_sum.row(b) = c.coupling->rowwise().sum().transpose();
  });
  for (size_t l = 0; l < supports.size(); ++l) r.blocks[l].curvature = r.coupling(l, l);
}

// Randomized coupling: each block's diagonal curvature C_ll from sign-flipped combinations.
void randomized_coupling(CurvatureEngine& engine, const ParamVector& u,
                         const std::vector<std::vector<size_t>>& supports,
                         const TaylorOptions& options, TaylorResult& r) {
  const size_t L = supports.size();
  TaylorBatches& t = r.batches;

  // With independent signs s_l and w = Σ s_l u_l: s_l u_lᵀ(Hw)_l = Σ_m s_l s_m C_lm, whose
  // expectation is C_ll; the cross terms average out at rate 1/sqrt(K).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const int64_t K = options.coupling_samples;
  Eigen::MatrixXd samples(L, K);
  t.block_curvature.setZero();
  for (int64_t k = 0; k < K; ++k) {
    auto signs = at::randint(0, 2, {static_cast<int64_t>(L)}, gen, at::kLong) * 2 - 1;
    Eigen::VectorXd s(L);
    ParamVector w = zeros_like(u);
    for (size_t l = 0; l < L; ++l) {
      s(static_cast<Eigen::Index>(l)) = static_cast<double>(signs[l].item<int64_t>());
      for (size_t p : supports[l]) w[p] = u[p].detach() * s(static_cast<Eigen::Index>(l));
    }
    // The same estimator per batch, averaged over the samples: its weighted mean over the
    // batches is the probe set's estimate.
    const Eigen::VectorXd uhw = engine.block_row(u, supports, w, [&](const CouplingTerms& c) {
      t.block_curvature.row(static_cast<Eigen::Index>(c.batch)) +=
          (s.cwiseProduct(c.coupling->col(0)) / static_cast<double>(K)).transpose();
    });
    samples.col(k) = s.cwiseProduct(uhw);
  }
  for (size_t l = 0; l < L; ++l) {
    const double mean = samples.row(l).mean();
    const double var = (samples.row(l).array() - mean).square().sum() / (K - 1);
    r.blocks[l].curvature = mean;
    r.blocks[l].curvature_sign_stderr = std::sqrt(var / K);
  }
}

// From the row sums u_lᵀ(Hu)_l (the coupling's, with full coupling): uᵀHu, the prediction, NDS,
// η*, the block and within/cross splits, and the per-batch tables summed over the ranks.
void totals(CurvatureEngine& engine, double u_sq, const Eigen::VectorXd& rows,
            const BlockPartition& blocks, const TaylorOptions& options, TaylorResult& r) {
  const size_t L = blocks.size();
  const size_t B = r.batches.loss.size();
  TaylorBatches& t = r.batches;
  const bool full = options.coupling == CouplingMode::kFull;
  r.curvature = full ? r.coupling.sum() : rows.sum();
  r.predicted = r.first_order + 0.5 * r.curvature;
  r.nds = r.curvature / u_sq;
  r.eta_star = r.curvature > 0.0 ? -r.first_order / r.curvature : kNaN;
  double within = 0.0;
  for (size_t l = 0; l < L; ++l) {
    auto& b = r.blocks[l];
    b.row_sum = rows(static_cast<Eigen::Index>(l));
    b.nds = b.sq_norm > 0.0 ? b.curvature / b.sq_norm : kNaN;
    within += b.curvature;
  }
  r.s_within = within / u_sq;
  if (full) {
    r.s_cross = (r.coupling.sum() - r.coupling.trace()) / u_sq;
  } else {
    r.s_cross = r.nds - r.s_within;
  }
  r.rho_within = r.s_within / r.nds;

  // Each rank's observers saw only its own batches (the other rows are zero): the per-batch
  // tables are the sums over the ranks.
  for (Eigen::MatrixXd* table : {&t.block_first_order, &t.block_curvature, &t.block_row_sum}) {
    engine.sum_over_ranks(table->data(), static_cast<size_t>(table->size()));
  }
  t.first_order.assign(B, 0.0);
  t.curvature.assign(B, 0.0);
  t.ggn.assign(B, kNaN);
  t.block_ggn =
      Eigen::MatrixXd::Constant(static_cast<Eigen::Index>(B), static_cast<Eigen::Index>(L), kNaN);
  t.within.assign(B, kNaN);
  for (size_t b = 0; b < B; ++b) {
    const auto i = static_cast<Eigen::Index>(b);
    t.first_order[b] = t.block_first_order.row(i).sum();
    t.curvature[b] = t.block_row_sum.row(i).sum();
    if (options.coupling != CouplingMode::kNone) t.within[b] = t.block_curvature.row(i).sum();
  }
}

}  // namespace

TaylorResult taylor_audit(CurvatureEngine& engine, const ParamVector& u,
                          const BlockPartition& blocks, const TaylorOptions& options,
                          const ParamVector* landing) {
  options.validate();
  const auto start = std::chrono::steady_clock::now();
  const int64_t hvps_before = engine.counters().hvps;
  const ParamVector& g = engine.gradient();
  if (u.size() != g.size()) {
    throw InvalidArgument(
        fmt::format("taylor_audit: direction of {} tensors for {} parameters", u.size(), g.size()));
  }
  const double u_sq = squared_norm(u);
  if (!std::isfinite(u_sq)) {
    throw InvalidArgument(fmt::format("taylor_audit: the direction has ‖u‖² = {}", u_sq));
  }
  if (u_sq == 0.0) {
    TaylorResult r = zero_direction_audit(engine, blocks, options);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return r;
  }
  TaylorResult r;
  r.coupling_mode = options.coupling;
  r.loss = engine.loss();
  r.update_norm = std::sqrt(u_sq);
  r.first_order = dot(g, u);

  const size_t L = blocks.size();
  const std::vector<double>& batch_losses = engine.batch_losses();
  const size_t B = batch_losses.size();
  TaylorBatches& t = r.batches;
  t.loss = batch_losses;
  t.weight.resize(B);
  for (size_t b = 0; b < B; ++b) t.weight[b] = engine.probe().weight(b);
  t.block_first_order = Eigen::MatrixXd::Zero(B, L);
  t.block_curvature = Eigen::MatrixXd::Constant(B, L, kNaN);
  t.block_row_sum = Eigen::MatrixXd::Zero(B, L);
  r.blocks.resize(L);
  const std::vector<double> uu = dots_per_tensor(u, u), gu = dots_per_tensor(g, u);
  for (size_t l = 0; l < L; ++l) {
    auto& b = r.blocks[l];
    b.name = blocks[l].name;
    b.sq_norm = sum_over(uu, blocks[l].params);
    b.first_order = sum_over(gu, blocks[l].params);
    b.curvature = kNaN;
  }

  std::vector<std::vector<size_t>> supports;
  for (size_t l = 0; l < L; ++l) supports.push_back(blocks[l].params);
  Eigen::VectorXd rows;  // u_lᵀ(Hu)_l: one second backward along u, or the coupling's row sums
  if (options.coupling == CouplingMode::kFull) {
    full_coupling(engine, u, supports, r);
    rows = r.coupling.rowwise().sum();
  } else {
    rows = engine.block_row(u, supports, u, [&](const CouplingTerms& c) {
      const auto b = static_cast<Eigen::Index>(c.batch);
      t.block_first_order.row(b) = c.first_order->transpose();
      t.block_row_sum.row(b) = c.coupling->col(0).transpose();
    });
  }
  if (options.coupling == CouplingMode::kRandomized) {
    randomized_coupling(engine, u, supports, options, r);
  }
  totals(engine, u_sq, rows, blocks, options, r);
  r.realized = r.loss_after = kNaN;
  t.realized.assign(B, kNaN);
  std::vector<double> at_step;
  if (options.realized) {
    r.loss_after = landing ? engine.loss_at_point(*landing, &at_step) : engine.loss_at(u, &at_step);
    r.realized = r.loss_after - r.loss;
    r.routing_changed =
        landing ? engine.routing_change_to_point(*landing) : engine.routing_change(u);
    t.realized = combine(at_step, -1.0, t.loss);
  }
  for (double eta : options.step_multipliers) {
    MultiplierTerms m;
    m.eta = eta;
    m.predicted = eta * r.first_order + 0.5 * eta * eta * r.curvature;
    m.realized = engine.loss_at(scaled(u, eta), &at_step) - r.loss;
    m.realized_stderr = batch_stderr(combine(at_step, -1.0, t.loss), t.weight);
    r.multipliers.push_back(m);
  }
  fill_stderrs(r, options.realized);
  if (options.ggn) gauss_newton_split(engine, u, blocks, options.ggn_blocks, r);
  r.hvps = engine.counters().hvps - hvps_before;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

NdsComparison compare_batch_nds(const std::vector<double>& wa, const std::vector<double>& nds_a,
                                const std::vector<double>& wb, const std::vector<double>& nds_b) {
  if (wa.size() != wb.size()) {
    throw InvalidArgument(fmt::format(
        "compare_nds: the audits ran on {} and {} probe batches; a paired comparison needs the "
        "same batches",
        wa.size(), wb.size()));
  }
  for (size_t i = 0; i < wa.size(); ++i) {
    if (wa[i] != wb[i]) {
      throw InvalidArgument(fmt::format(
          "compare_nds: probe batch {} weighs {} in one audit and {} in the other; a paired "
          "comparison needs the same batches",
          i, wa[i], wb[i]));
    }
  }
  NdsComparison c;
  c.nds_a = batch_mean(nds_a, wa);
  c.nds_b = batch_mean(nds_b, wa);
  c.difference = c.nds_a - c.nds_b;
  c.difference_stderr = batch_stderr(combine(nds_a, -1.0, nds_b), wa);
  c.ratio = c.nds_a / c.nds_b;
  c.ratio_stderr = ratio_stderr(nds_a, nds_b, wa);
  return c;
}

NdsComparison compare_nds(const TaylorResult& a, const TaylorResult& b) {
  NdsComparison c = compare_batch_nds(
      a.batches.weight, times(a.batches.curvature, 1.0 / (a.update_norm * a.update_norm)),
      b.batches.weight, times(b.batches.curvature, 1.0 / (b.update_norm * b.update_norm)));
  // The audits' own values, which the per-batch means equal up to rounding.
  c.nds_a = a.nds;
  c.nds_b = b.nds;
  c.difference = a.nds - b.nds;
  c.ratio = a.nds / b.nds;
  return c;
}

}  // namespace curv
