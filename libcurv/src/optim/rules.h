// The update rules behind optimizer_table() (not public API): one factory per rule, and the
// pieces several rules share. Each rule follows its reference implementation operation for
// operation, so that a step rebuilt from saved state is the step the reference takes
// (docs/optimizers.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>
#include <vector>

#include "curv/optim/optimizers.h"

namespace curv::rules {

using Factory = std::unique_ptr<Optimizer>(const OptimizerConfig&, const ParamSpace&,
                                           const ModelStructure&);

// optimizers.cpp: AdamW and Adam (one class), Muon and NorMuon (one class), SGD, signSGD, Signum,
// Lion.
Factory adamw, muon_family, sgd, signsgd, signum, lion;
// adaptive_rules.cpp: torch.optim's Muon, NAdam, RAdam and Adafactor; pytorch-optimizer's
// AdEMAMix; schedulefree's AdamWScheduleFree.
Factory torch_muon, nadam, radam, adafactor, ademamix, adamw_schedulefree;
// soap.cpp, shampoo.cpp, kron.cpp, adamuon.cpp, mars.cpp: pytorch-optimizer's SOAP, Shampoo, Kron
// (PSGD), AdaMuon and MARS.
Factory soap, shampoo, kron, adamuon, mars;
// adam_mini.cpp, scion.cpp: adam-mini's Adam_mini, pytorch-optimizer's SCION.
Factory adam_mini, scion;

// PyTorch's AdamW step, operation for operation (torch/optim/adamw.py, single-tensor path): u
// for θ with gradient g, moments m and v updated in place, at step t.
at::Tensor adamw_update(const at::Tensor& theta, const at::Tensor& g, at::Tensor& m, at::Tensor& v,
                        int64_t t, double lr, double b1, double b2, double eps, double wd);

// Weight decay as torch.optim and pytorch-optimizer apply it before a step: decoupled, the
// parameter becomes θ(1 − wd·scale) (scale lr, or 1 for a fixed decay) and the gradient stays;
// else the parameter stays and the gradient becomes g + wd·θ (L2). Returns {θ', gradient}.
std::pair<at::Tensor, at::Tensor> weight_decayed(const at::Tensor& theta, const at::Tensor& g,
                                                 double wd, bool decoupled, double scale);

// pytorch-optimizer's zero_power_via_newton_schulz_5 with one coefficient tuple (a, b, c), in
// bfloat16 as it runs: X ← aX + (bA + cA²)X, A = XXᵀ, from X = G/‖G‖ (transposed when tall);
// the bfloat16 result (AdaMuon, SCION).
at::Tensor newton_schulz_bf16(const at::Tensor& g, int64_t steps, double a, double b, double c);

// The Muon rules' partition: parameter i is orthogonalised when it has two or more dimensions
// and its name matches config.muon_params (a regex), or, without one, when `structure` calls it
// a hidden matrix (not an embedding or the head). The others take the AdamW part (adam_*).
std::vector<bool> muon_partition(const OptimizerConfig& config, const ParamSpace& space,
                                 const ModelStructure& structure);

}  // namespace curv::rules
