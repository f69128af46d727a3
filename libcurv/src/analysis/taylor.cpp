#include "curv/analysis/taylor.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "curv/core/engine.h"
#include "curv/core/error.h"

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
    throw InvalidArgument(
        fmt::format("TaylorOptions.coupling_samples = {} must be >= 2", coupling_samples));
  }
  for (double eta : step_multipliers) {
    if (!std::isfinite(eta)) {
      throw InvalidArgument(fmt::format("TaylorOptions.step_multipliers holds {}", eta));
    }
  }
}

std::string TaylorResult::brief() const {
  return fmt::format(
      "loss {:.5g}, NDS {:.5g}, predicted {:.4g}, realized {:.4g}, ρ_within {:.3g}, "
      "{} HVPs, {:.2f} s",
      loss, nds, predicted, realized, rho_within, hvps, seconds);
}

TaylorResult taylor_audit(CurvatureEngine& engine, const ParamVector& u,
                          const BlockPartition& blocks, const TaylorOptions& options) {
  options.validate();
  const auto start = std::chrono::steady_clock::now();
  const int64_t hvps_before = engine.counters().hvps;
  const ParamVector& g = engine.gradient();
  if (u.size() != g.size()) {
    throw InvalidArgument(
        fmt::format("taylor_audit: direction of {} tensors for {} parameters", u.size(), g.size()));
  }
  TaylorResult r;
  r.coupling_mode = options.coupling;
  r.loss = engine.loss();
  const double u_sq = squared_norm(u);
  if (!(u_sq > 0.0)) throw InvalidArgument("taylor_audit: the direction is zero");
  r.update_norm = std::sqrt(u_sq);
  r.first_order = dot(g, u);

  const size_t L = blocks.size();
  r.blocks.resize(L);
  for (size_t l = 0; l < L; ++l) {
    auto& b = r.blocks[l];
    b.name = blocks[l].name;
    b.sq_norm = dot(u, u, blocks[l].params);
    b.first_order = dot(g, u, blocks[l].params);
    b.curvature = kNaN;
  }

  ParamVector hu;  // H u
  if (options.coupling == CouplingMode::kFull) {
    // H u_m for each block; by linearity their sum is H u, so the totals cost nothing extra.
    r.coupling = Eigen::MatrixXd::Zero(L, L);
    for (size_t m = 0; m < L; ++m) {
      if (r.blocks[m].sq_norm == 0.0) continue;
      // Only block m's gradients start the second backward (u is zero elsewhere).
      ParamVector h_m = engine.hvp(u, blocks[m].params);
      for (size_t l = 0; l < L; ++l) r.coupling(l, m) = dot(u, h_m, blocks[l].params);
      if (hu.empty()) {
        hu = std::move(h_m);
      } else {
        axpy(1.0, h_m, hu);
      }
    }
    if (hu.empty()) hu = zeros_like(g);
    for (size_t l = 0; l < L; ++l) r.blocks[l].curvature = r.coupling(l, l);
  } else {
    hu = engine.hvp(u);
  }
  if (options.coupling == CouplingMode::kRandomized) {
    // With independent signs s_l and w = Σ s_l u_l: s_l u_lᵀ(Hw)_l = Σ_m s_l s_m C_lm, whose
    // expectation is C_ll; the cross terms average out at rate 1/sqrt(K).
    auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
    const int64_t K = options.coupling_samples;
    Eigen::MatrixXd samples(L, K);
    for (int64_t k = 0; k < K; ++k) {
      auto signs = at::randint(0, 2, {static_cast<int64_t>(L)}, gen, at::kLong) * 2 - 1;
      ParamVector w = zeros_like(u);
      for (size_t l = 0; l < L; ++l) {
        const double s = static_cast<double>(signs[l].item<int64_t>());
        for (size_t p : blocks[l].params) w[p] = u[p].detach() * s;
      }
      ParamVector hw = engine.hvp(w);
      for (size_t l = 0; l < L; ++l) {
        samples(l, k) =
            static_cast<double>(signs[l].item<int64_t>()) * dot(u, hw, blocks[l].params);
      }
    }
    for (size_t l = 0; l < L; ++l) {
      const double mean = samples.row(l).mean();
      const double var = (samples.row(l).array() - mean).square().sum() / (K - 1);
      r.blocks[l].curvature = mean;
      r.blocks[l].curvature_stderr = std::sqrt(var / K);
    }
  }

  r.curvature = dot(u, hu);
  r.predicted = r.first_order + 0.5 * r.curvature;
  r.nds = r.curvature / u_sq;
  r.eta_star = r.curvature > 0.0 ? -r.first_order / r.curvature : kNaN;
  double within = 0.0;
  for (size_t l = 0; l < L; ++l) {
    auto& b = r.blocks[l];
    b.row_sum = dot(u, hu, blocks[l].params);
    b.nds = b.sq_norm > 0.0 ? b.curvature / b.sq_norm : kNaN;
    within += b.curvature;
  }
  r.s_within = within / u_sq;
  if (options.coupling == CouplingMode::kFull) {
    // From the off-diagonal entries themselves, not as a difference, so S_within + S_cross = NDS
    // is a check on the numbers rather than true by construction.
    r.s_cross = (r.coupling.sum() - r.coupling.trace()) / u_sq;
  } else {
    r.s_cross = r.nds - r.s_within;
  }
  r.rho_within = r.s_within / r.nds;

  r.realized = kNaN;
  if (options.realized) r.realized = engine.loss_at(u) - r.loss;
  for (double eta : options.step_multipliers) {
    MultiplierTerms m;
    m.eta = eta;
    m.predicted = eta * r.first_order + 0.5 * eta * eta * r.curvature;
    m.realized = engine.loss_at(scaled(u, eta)) - r.loss;
    r.multipliers.push_back(m);
  }
  r.hvps = engine.counters().hvps - hvps_before;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace curv
