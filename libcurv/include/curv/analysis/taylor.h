// Second-order Taylor audit of one step u at the engine's parameters: first-order gain, curvature
// penalty, predicted vs realized loss change, NDS, and their breakdown over blocks, including the
// block coupling matrix C_lm = u_lᵀ H_lm u_m whose diagonal is the within-layer curvature.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <vector>

#include "curv/core/blocks.h"
#include "curv/core/param_space.h"

namespace curv {

class CurvatureEngine;

enum class CouplingMode {
  kFull,        // one HVP per block: the exact L x L matrix C
  kRandomized,  // Rademacher signs over blocks: unbiased estimates of every C_ll, K HVPs
  kNone,        // one HVP: totals and row sums only, C_ll left NaN
};
CouplingMode parse_coupling_mode(const std::string& text);  // "full" | "random" | "none"
std::string to_string(CouplingMode mode);

struct TaylorOptions {
  CouplingMode coupling = CouplingMode::kFull;
  // HVPs for CouplingMode::kRandomized (>= 2, so a standard error exists).
  int64_t coupling_samples = 32;
  uint64_t seed = 0;  // seeds the Rademacher signs
  // Evaluate L(θ + u) on the probe set (one forward pass per batch).
  bool realized = true;
  // Also compare realized and predicted change at θ + η·u for each η here.
  std::vector<double> step_multipliers;

  void validate() const;
};

struct BlockTerms {
  std::string name;
  double sq_norm = 0;           // ‖u_l‖²
  double first_order = 0;       // g_l·u_l
  double curvature = 0;         // C_ll = u_lᵀ H_ll u_l (NaN with CouplingMode::kNone)
  double curvature_stderr = 0;  // standard error of C_ll under kRandomized, else 0
  double row_sum = 0;           // u_lᵀ (Hu)_l = Σ_m C_lm
  double nds = 0;               // C_ll / ‖u_l‖² (NaN when u_l = 0 or C_ll unknown)
};

struct MultiplierTerms {
  double eta = 0;
  double predicted = 0;  // η g·u + ½ η² uᵀHu
  double realized = 0;   // L(θ + η u) − L(θ)
};

struct TaylorResult {
  double loss = 0;         // L(θ)
  double first_order = 0;  // g·u (first-order gain = −g·u)
  double curvature = 0;    // uᵀHu (curvature penalty = ½ uᵀHu)
  double predicted = 0;    // g·u + ½ uᵀHu
  double realized = 0;     // L(θ+u) − L(θ), NaN when not evaluated
  double nds = 0;          // uᵀHu / ‖u‖²
  double eta_star = 0;     // −g·u / uᵀHu when uᵀHu > 0, else NaN
  double update_norm = 0;  // ‖u‖
  std::vector<BlockTerms> blocks;
  Eigen::MatrixXd coupling;  // L x L with CouplingMode::kFull, else empty
  double s_within = 0;       // Σ_l C_ll / ‖u‖²
  double s_cross = 0;        // Σ_{l≠m} C_lm / ‖u‖² = NDS − S_within
  double rho_within = 0;     // S_within / NDS
  std::vector<MultiplierTerms> multipliers;
  CouplingMode coupling_mode = CouplingMode::kFull;
  int64_t hvps = 0;
  double seconds = 0;

  std::string brief() const;  // one line: NDS, predicted vs realized, ρ_within
};

// Runs the audit at the engine's current parameters. Throws InvalidArgument for a zero or
// wrongly shaped u.
TaylorResult taylor_audit(CurvatureEngine& engine, const ParamVector& u,
                          const BlockPartition& blocks, const TaylorOptions& options = {});

}  // namespace curv
