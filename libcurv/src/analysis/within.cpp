#include "curv/analysis/within.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <regex>

#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/optim/optimizers.h"

namespace curv {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Row/column groups of one matrix: (name, rows [r0, r1), columns [c0, c1)).
struct Group {
  std::string name;
  int64_t r0, r1, c0, c1;
};

std::vector<Group> groups_for(const std::string& name, int64_t rows, int64_t cols,
                              const WithinOptions& o) {
  std::vector<Group> out;
  if (o.n_head > 0 && ends_with(name, "attn.c_attn.weight") && rows % 3 == 0 &&
      (rows / 3) % o.n_head == 0) {
    const int64_t C = rows / 3, hs = C / o.n_head;
    const char* parts[] = {"q", "k", "v"};
    for (int s = 0; s < 3; ++s) out.push_back({parts[s], s * C, (s + 1) * C, 0, cols});
    for (int s = 0; s < 3; ++s) {
      for (int64_t h = 0; h < o.n_head; ++h) {
        out.push_back({fmt::format("{}.head{}", parts[s], h), s * C + h * hs, s * C + (h + 1) * hs,
                       0, cols});
      }
    }
    return out;
  }
  if (o.n_head > 0 && ends_with(name, "attn.c_proj.weight") && cols % o.n_head == 0) {
    // The output projection reads head h from input columns [h·hs, (h+1)·hs).
    const int64_t hs = cols / o.n_head;
    for (int64_t h = 0; h < o.n_head; ++h) {
      out.push_back({fmt::format("head{}", h), 0, rows, h * hs, (h + 1) * hs});
    }
    return out;
  }
  if (o.row_chunks > 0) {
    const int64_t chunks = std::min(o.row_chunks, rows);
    for (int64_t k = 0; k < chunks; ++k) {
      out.push_back({fmt::format("rows{}", k), k * rows / chunks, (k + 1) * rows / chunks, 0, cols});
    }
  }
  return out;
}

}  // namespace

void WithinOptions::validate() const {
  auto non_negative = [](const char* field, int64_t v) {
    if (v < 0) throw InvalidArgument(fmt::format("WithinOptions.{} = {} must be >= 0", field, v));
  };
  non_negative("modes", modes);
  non_negative("n_head", n_head);
  non_negative("row_chunks", row_chunks);
  non_negative("max_hvps", max_hvps);
  non_negative("top_k_energy", top_k_energy);
  if (!param_regex.empty()) {
    try {
      std::regex check(param_regex);
    } catch (const std::regex_error& e) {
      throw InvalidArgument(fmt::format("WithinOptions.param_regex '{}' is invalid: {}", param_regex,
                                        e.what()));
    }
  }
}

std::vector<size_t> within_selection(const ParamSpace& space, const WithinOptions& options) {
  options.validate();
  std::vector<size_t> out;
  std::regex pattern(options.param_regex.empty() ? "." : options.param_regex);
  for (size_t i = 0; i < space.size(); ++i) {
    const auto& p = space[i];
    if (p.shape.size() != 2) continue;
    if (options.param_regex.empty() ? !is_hidden_matrix(p) : !std::regex_search(p.name, pattern)) {
      continue;
    }
    out.push_back(i);
  }
  return out;
}

WithinReport within_block(CurvatureEngine& engine, const ParamVector& u, const WithinOptions& options) {
  const auto& space = engine.space();
  WithinReport report;
  const int64_t hvps_before = engine.counters().hvps;
  auto budget_left = [&](int64_t needed) {
    return options.max_hvps == 0 || engine.counters().hvps - hvps_before + needed <= options.max_hvps;
  };
  // u restricted to one parameter's entries, as a full-space direction.
  auto only = [&](size_t index, const at::Tensor& value) {
    ParamVector d = zeros_like(u);
    d[index] = value.to(u[index].scalar_type());
    return d;
  };
  for (size_t index : within_selection(space, options)) {
    const auto& info = space[index];
    const at::Tensor U = u[index].detach().to(at::kCPU, at::kDouble);
    const int64_t rows = info.shape[0], cols = info.shape[1];
    const auto groups = groups_for(info.name, rows, cols, options);
    const int64_t k = std::min<int64_t>(options.modes, std::min(rows, cols));
    if (!budget_left(k + static_cast<int64_t>(groups.size()))) {
      report.skipped.push_back(info.name);
      continue;
    }
    WithinParam w;
    w.name = info.name;
    w.shape = info.shape;
    w.sq_norm = U.square().sum().item<double>();

    auto svd = at::linalg_svd(U, /*full_matrices=*/false);
    const at::Tensor& A = std::get<0>(svd);
    const at::Tensor S = std::get<1>(svd).contiguous();
    const at::Tensor& Vh = std::get<2>(svd);
    const double* s = S.data_ptr<double>();
    double energy = 0.0;
    for (int64_t i = 0; i < S.numel(); ++i) {
      w.singular_values.push_back(s[i]);
      energy += s[i] * s[i];
    }
    if (energy > 0.0) {
      double entropy = 0.0, top = 0.0;
      for (int64_t i = 0; i < S.numel(); ++i) {
        const double p = s[i] * s[i] / energy;
        if (p > 0.0) entropy -= p * std::log(p);
        if (i < options.top_k_energy) top += p;
      }
      w.svd_entropy = S.numel() > 1 ? entropy / std::log(static_cast<double>(S.numel())) : 0.0;
      w.effective_rank = std::exp(entropy);
      w.top_k_energy = top;
    } else {
      w.svd_entropy = w.effective_rank = w.top_k_energy = kNaN;
    }

    const auto device = u[index].device();
    for (int64_t i = 0; i < k; ++i) {
      // The unit-Frobenius rank-one direction a_i b_iᵀ of mode i.
      at::Tensor mode = at::outer(A.select(1, i), Vh.select(0, i)).to(device);
      ParamVector d = only(index, mode);
      ModeTerms m;
      m.index = i;
      m.sigma = s[i];
      m.energy_share = energy > 0.0 ? s[i] * s[i] / energy : kNaN;
      m.curvature = dot(d, engine.hvp(d));
      w.modes.push_back(m);
    }
    for (const auto& g : groups) {
      at::Tensor part = at::zeros_like(U);
      part.slice(0, g.r0, g.r1).slice(1, g.c0, g.c1).copy_(U.slice(0, g.r0, g.r1).slice(1, g.c0, g.c1));
      GroupTerms t;
      t.name = g.name;
      t.sq_norm = part.square().sum().item<double>();
      if (t.sq_norm > 0.0) {
        ParamVector d = only(index, part.to(device));
        t.curvature = dot(d, engine.hvp(d));
        t.nds = t.curvature / t.sq_norm;
      } else {
        t.curvature = 0.0;
        t.nds = kNaN;
      }
      w.groups.push_back(t);
    }
    report.params.push_back(std::move(w));
  }
  report.hvps = engine.counters().hvps - hvps_before;
  return report;
}

}  // namespace curv
