// Standard errors over probe batches. Every probe-set quantity is a weighted mean of per-batch
// terms, x = Σ_b w_b x_b with w_b = N_b / N, so the batches are the replicates: treating them as
// independent draws of the data, SE(x) = sqrt(B/(B−1) · Σ_b w_b² (x_b − x)²), which is the usual
// s/sqrt(B) for equal batches. One batch has no spread to measure: its SE is NaN.
#pragma once

#include <vector>

namespace curv {

// Σ_b w_b x_b. InvalidArgument when the lengths differ.
double batch_mean(const std::vector<double>& x, const std::vector<double>& weights);
// sqrt(B/(B−1) · Σ_b w_b² (x_b − x)²) about x = batch_mean(x, w); NaN for fewer than two batches.
double batch_stderr(const std::vector<double>& x, const std::vector<double>& weights);
// The standard error of the ratio R = a/c of two batch means by the delta method: the batch SE of
// z_b = (a_b − R c_b) / c, i.e. sqrt(Var(a) − 2R Cov(a, c) + R² Var(c)) / |c| with the batch
// (co)variances above. NaN when c = 0 or for fewer than two batches.
double ratio_stderr(const std::vector<double>& a, const std::vector<double>& c,
                    const std::vector<double>& weights);

}  // namespace curv
