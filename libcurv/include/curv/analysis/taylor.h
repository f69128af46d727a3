// Second-order Taylor audit of one step u at the engine's parameters: first-order gain, curvature
// penalty, predicted vs realized loss change, NDS, and their breakdown over blocks, including the
// block coupling matrix C_lm = u_lᵀ H_lm u_m whose diagonal is the within-layer curvature. Every
// probe-set number comes with its standard error over the probe batches (core/statistics.h), from
// the per-batch terms of the same passes.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <limits>
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
  // The Gauss-Newton split uᵀHu = uᵀGu + residual (objectives with logits only): one forward and
  // one JVP per batch; with ggn_blocks, one JVP per block and the split of every C_ll.
  bool ggn = false;
  bool ggn_blocks = false;

  void validate() const;
};

// A value that was not computed (the Gauss-Newton terms without TaylorOptions::ggn).
inline constexpr double kUnset = std::numeric_limits<double>::quiet_NaN();

// Standard errors below are over probe batches (NaN with a single batch, or where the value is).
struct BlockTerms {
  std::string name;
  double sq_norm = 0;      // ‖u_l‖²
  double first_order = 0;  // g_l·u_l
  double curvature = 0;    // C_ll = u_lᵀ H_ll u_l (NaN with CouplingMode::kNone)
  double row_sum = 0;      // u_lᵀ (Hu)_l = Σ_m C_lm
  double nds = 0;          // C_ll / ‖u_l‖² (NaN when u_l = 0 or C_ll unknown)
  double first_order_stderr = 0;
  double curvature_stderr = 0;
  double row_sum_stderr = 0;
  double predicted_stderr = 0;  // of the block's share g_l·u_l + ½ u_lᵀ(Hu)_l
  double nds_stderr = 0;
  // Under kRandomized only: the Monte Carlo standard error of C_ll over the K sign vectors (the
  // estimate's own noise at the probe set, apart from the batch SE above); else 0.
  double curvature_sign_stderr = 0;
  // With TaylorOptions::ggn_blocks: G_ll = (J u_l)ᵀ H_out (J u_l), its NDS, and the residual
  // C_ll − G_ll (NaN unless CouplingMode::kFull); NaN otherwise.
  double ggn_curvature = kUnset;
  double ggn_nds = kUnset;
  double residual_curvature = kUnset;
  double ggn_curvature_stderr = kUnset;
  double residual_curvature_stderr = kUnset;
};

struct MultiplierTerms {
  double eta = 0;
  double predicted = 0;  // η g·u + ½ η² uᵀHu
  double realized = 0;   // L(θ + η u) − L(θ)
  double predicted_stderr = 0;
  double realized_stderr = 0;
};

// The per-batch terms behind the standard errors, aligned with the probe set's batches: the
// probe-set values are their weighted means Σ_b w_b x_b. Kept so that two audits on the same
// batches can be compared pairwise (compare_nds).
struct TaylorBatches {
  std::vector<double> weight;         // w_b = N_b / N
  std::vector<double> loss;           // L_b(θ)
  std::vector<double> first_order;    // g_b·u
  std::vector<double> curvature;      // uᵀ H_b u
  std::vector<double> realized;       // L_b(θ+u) − L_b(θ) (NaN when not evaluated)
  std::vector<double> within;         // Σ_l u_lᵀ H_b,ll u_l (NaN with CouplingMode::kNone)
  Eigen::MatrixXd block_first_order;  // B x L: g_b,l·u_l
  Eigen::MatrixXd block_curvature;    // B x L: u_lᵀ H_b,ll u_l (the per-batch C_ll)
  Eigen::MatrixXd block_row_sum;      // B x L: u_lᵀ (H_b u)_l
  std::vector<double> ggn;            // uᵀ G_b u (NaN without TaylorOptions::ggn)
  Eigen::MatrixXd block_ggn;          // B x L: G_b,ll (NaN without TaylorOptions::ggn_blocks)
  size_t size() const { return weight.size(); }
};

// Whether an audit's ratios exist. A zero direction (a learning rate of 0 at the end of a
// schedule, two identical checkpoints) is a result, not an error: g·u, uᵀHu and the predicted and
// realized changes are exactly 0, and NDS, η*, S_within, S_cross and ρ_within (0/0) are NaN.
enum class AuditStatus {
  kComplete,
  kZeroDirection,
};
std::string to_string(AuditStatus status);  // "complete" | "zero_direction"

struct TaylorResult {
  AuditStatus status = AuditStatus::kComplete;
  double loss = 0;         // L(θ)
  double first_order = 0;  // g·u (first-order gain = −g·u)
  double curvature = 0;    // uᵀHu (curvature penalty = ½ uᵀHu)
  double predicted = 0;    // g·u + ½ uᵀHu
  double realized = 0;     // L(θ+u) − L(θ), NaN when not evaluated
  double loss_after = 0;   // L(θ+u) itself, NaN when not evaluated
  // A mixture of experts: the share of routing choices that differ between θ and θ+u
  // (CurvatureEngine::routing_change); NaN for other models or when realized is not evaluated.
  double routing_changed = kUnset;
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

  // Standard errors over probe batches of the values above. SE(NDS) = SE(uᵀHu)/‖u‖² (‖u‖ is not
  // random); ρ_within and η* are ratios, with delta-method SEs.
  double loss_stderr = 0;
  double first_order_stderr = 0;
  double curvature_stderr = 0;
  double predicted_stderr = 0;
  double realized_stderr = 0;
  double nds_stderr = 0;
  double s_within_stderr = 0;
  double s_cross_stderr = 0;
  double rho_within_stderr = 0;
  double eta_star_stderr = 0;
  // The Gauss-Newton split (TaylorOptions::ggn; NaN otherwise): uᵀGu = (Ju)ᵀ H_out (Ju) ≥ 0 and
  // the residual uᵀHu − uᵀGu, the functional Hessian's part, with their NDS and SEs.
  double ggn_curvature = kUnset;
  double ggn_nds = kUnset;
  double residual_curvature = kUnset;
  double residual_nds = kUnset;
  double ggn_nds_stderr = kUnset;
  double residual_nds_stderr = kUnset;
  TaylorBatches batches;

  std::string brief() const;  // one line: NDS ± SE, predicted vs realized, ρ_within
};

// Runs the audit at the engine's current parameters. A u that is zero everywhere gives
// AuditStatus::kZeroDirection with no HVP or forward pass beyond L(θ); a wrongly shaped u throws
// InvalidArgument. `landing`, when given, is θ + u as a point (the delta's next checkpoint): the
// realized change is evaluated there, free of the rounding of θ + u, and equals the difference
// of the two checkpoints' losses.
TaylorResult taylor_audit(CurvatureEngine& engine, const ParamVector& u,
                          const BlockPartition& blocks, const TaylorOptions& options = {},
                          const ParamVector* landing = nullptr);

// A paired comparison of two audits a and b on the same probe batches (two directions at one
// checkpoint, or one direction of two runs probed on one probe set): the NDS difference and ratio
// with standard errors from the per-batch pairs, so the batches' shared noise cancels.
struct NdsComparison {
  double nds_a = 0, nds_b = 0;
  double difference = 0;  // NDS_a − NDS_b
  double difference_stderr = 0;
  double ratio = 0;         // NDS_a / NDS_b
  double ratio_stderr = 0;  // delta method on the per-batch pairs
};
// InvalidArgument when the audits' batches differ in number or weight.
NdsComparison compare_nds(const TaylorResult& a, const TaylorResult& b);
// The same from per-batch NDS values uᵀH_b u / ‖u‖² and the batch weights of each audit.
NdsComparison compare_batch_nds(const std::vector<double>& weight_a,
                                const std::vector<double>& nds_a,
                                const std::vector<double>& weight_b,
                                const std::vector<double>& nds_b);

}  // namespace curv
