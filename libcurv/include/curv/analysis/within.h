// Within-block curvature of an update: for each selected matrix parameter, the curvature of each
// singular mode of its update, the curvature of row groups (attention heads, Q/K/V slices, found
// by the parameters' roles in the model's structure), and
// how isotropic the update's singular spectrum is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "curv/core/param_space.h"
#include "curv/core/structure.h"

namespace curv {

class CurvatureEngine;

struct WithinOptions {
  // Parameters to analyse (ECMAScript regex on the full name). Empty: every 2-D parameter except
  // embeddings and the output head.
  std::string param_regex;
  // Singular modes per parameter whose curvature κ_i is measured (one HVP each).
  int64_t modes = 4;
  // Query heads of the attention layers (0 turns head groups off; the model's count is
  // Objective::structure().n_head). Attention matrices are found by role in the structure: a
  // fused Q/K/V projection splits into its q/k/v row slices and their heads, separate query /
  // key / value projections into heads by rows, the attention output into heads by input column.
  int64_t n_head = 0;
  // Key/value heads (grouped-query attention); 0: the structure's n_kv_head when its n_head is
  // n_head, else n_head.
  int64_t n_kv_head = 0;
  // Other matrices: split rows into this many equal groups (0 = none).
  int64_t row_chunks = 0;
  // Upper bound on the HVPs spent here (0 = no bound); parameters past it are skipped and the
  // report says so.
  int64_t max_hvps = 0;
  // Energy fraction of the top `top_k_energy` modes is reported as an isotropy measure.
  int64_t top_k_energy = 4;

  void validate() const;
};

struct ModeTerms {
  int64_t index = 0;
  double sigma = 0;         // σ_i of the update matrix
  double energy_share = 0;  // σ_i² / Σ σ_j²
  double curvature = 0;     // κ_i = (a_i b_iᵀ)ᵀ H (a_i b_iᵀ), a unit-norm direction
};

struct GroupTerms {
  std::string name;      // "q.head0", "k", "head3", "rows0" ...
  double sq_norm = 0;    // ‖u_g‖²
  double curvature = 0;  // u_gᵀ H u_g
  double nds = 0;        // u_gᵀ H u_g / ‖u_g‖² (NaN when u_g = 0)
};

struct WithinParam {
  std::string name;
  std::vector<int64_t> shape;
  double sq_norm = 0;
  std::vector<double> singular_values;  // all of them, descending
  double svd_entropy = 0;     // H(p) / log(r), p_i = σ_i²/Σσ², r = number of singular values
  double effective_rank = 0;  // exp(H(p))
  double top_k_energy = 0;    // Σ_{i<k} p_i
  std::vector<ModeTerms> modes;
  std::vector<GroupTerms> groups;
};

struct WithinReport {
  std::vector<WithinParam> params;
  std::vector<std::string> skipped;  // parameters not analysed because max_hvps ran out
  int64_t hvps = 0;
};

// Parameters WithinOptions selects in `space`: by param_regex, or every 2-D hidden matrix of the
// structure (not embeddings or head). Without a structure, the name rules' one.
std::vector<size_t> within_selection(const ParamSpace& space, const ModelStructure& structure,
                                     const WithinOptions& options);
std::vector<size_t> within_selection(const ParamSpace& space, const WithinOptions& options);

WithinReport within_block(CurvatureEngine& engine, const ParamVector& u,
                          const WithinOptions& options = {});

}  // namespace curv
