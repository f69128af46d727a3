#include "curv/analysis/within.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>
#include <regex>

#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/structure.h"

namespace curv {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Row/column groups of one matrix: (name, rows [r0, r1), columns [c0, c1)).
struct Group {
  std::string name;
  int64_t r0, r1, c0, c1;
};

const char* slice_label(ParamRole role) {
  switch (role) {
    case ParamRole::kAttentionQuery:
      return "q";
    case ParamRole::kAttentionKey:
      return "k";
    case ParamRole::kAttentionValue:
      return "v";
    default:
      return role_name(role);
  }
}

// Attention groups by role: a fused projection's query/key/value slices and each slice's heads
// (n_head query heads, n_kv_head key/value heads); a separate query, key or value projection's
// heads by rows; the attention output's heads by input column. Empty when the rows or columns do
// not split evenly, so the matrix falls back to row chunks.
std::vector<Group> attention_groups(const ParamStructure& p, int64_t rows, int64_t cols,
                                    int64_t n_head, int64_t n_kv_head) {
  std::vector<Group> out;
  auto heads_of = [&](ParamRole role) {
    return role == ParamRole::kAttentionQuery ? n_head : n_kv_head;
  };
  switch (p.role) {
    case ParamRole::kFusedQkv: {
      if (p.slices.empty()) return {};
      // One slice per head and role (GPT-NeoX's rows interleave q, k and v head by head): each
      // slice is that head's group of its role.
      std::map<ParamRole, int64_t> per_role;
      for (const auto& s : p.slices) ++per_role[s.role];
      bool per_head = true;
      for (const auto& [role, count] : per_role) per_head = per_head && count == heads_of(role);
      if (per_head && static_cast<int64_t>(p.slices.size()) > 3) {
        std::map<ParamRole, int64_t> seen;
        for (const auto& s : p.slices) {
          out.push_back({fmt::format("{}.head{}", slice_label(s.role), seen[s.role]++), s.begin,
                         s.end, 0, cols});
        }
        return out;
      }
      for (const auto& s : p.slices) {
        const int64_t heads = heads_of(s.role);
        if (heads <= 0 || (s.end - s.begin) % heads != 0) return {};
      }
      for (const auto& s : p.slices) out.push_back({slice_label(s.role), s.begin, s.end, 0, cols});
      for (const auto& s : p.slices) {
        const int64_t heads = heads_of(s.role), hs = (s.end - s.begin) / heads;
        for (int64_t h = 0; h < heads; ++h) {
          out.push_back({fmt::format("{}.head{}", slice_label(s.role), h), s.begin + h * hs,
                         s.begin + (h + 1) * hs, 0, cols});
        }
      }
      return out;
    }
    case ParamRole::kAttentionQuery:
    case ParamRole::kAttentionKey:
    case ParamRole::kAttentionValue: {
      const int64_t heads = heads_of(p.role);
      if (heads <= 0 || rows % heads != 0) return {};
      const int64_t hs = rows / heads;
      for (int64_t h = 0; h < heads; ++h) {
        out.push_back({fmt::format("head{}", h), h * hs, (h + 1) * hs, 0, cols});
      }
      return out;
    }
    case ParamRole::kAttentionOutput: {
      // The output projection reads head h from input columns [h·hs, (h+1)·hs).
      if (n_head <= 0 || cols % n_head != 0) return {};
      const int64_t hs = cols / n_head;
      for (int64_t h = 0; h < n_head; ++h) {
        out.push_back({fmt::format("head{}", h), 0, rows, h * hs, (h + 1) * hs});
      }
      return out;
    }
    default:
      return {};
  }
}

std::vector<Group> groups_for(const ParamStructure& p, int64_t rows, int64_t cols,
                              const WithinOptions& o, int64_t n_kv_head) {
  if (p.transposed) {
    // Stored [in, out]: the groups of the [out, in] matrix, with rows and columns swapped.
    ParamStructure as_linear = p;
    as_linear.transposed = false;
    auto out = groups_for(as_linear, cols, rows, o, n_kv_head);
    for (auto& g : out) {
      std::swap(g.r0, g.c0);
      std::swap(g.r1, g.c1);
    }
    return out;
  }
  if (o.n_head > 0) {
    auto out = attention_groups(p, rows, cols, o.n_head, n_kv_head);
    if (!out.empty()) return out;
  }
  std::vector<Group> out;
  if (o.row_chunks > 0) {
    const int64_t chunks = std::min(o.row_chunks, rows);
    for (int64_t k = 0; k < chunks; ++k) {
      out.push_back(
          {fmt::format("rows{}", k), k * rows / chunks, (k + 1) * rows / chunks, 0, cols});
    }
  }
  return out;
}

}  // namespace

void WithinOptions::validate() const {
  auto non_negative = [](const char* field, int64_t v) {
    if (v < 0) {
      throw InvalidOption("{0} must be >= 0",
                          {{fmt::format("WithinOptions.{}", field), fmt::format("{}", v)}});
    }
  };
  non_negative("modes", modes);
  non_negative("n_head", n_head);
  non_negative("n_kv_head", n_kv_head);
  if (n_kv_head > 0 && (n_head == 0 || n_head % n_kv_head != 0)) {
    throw InvalidOption("{0} must divide {1}",
                        {{"WithinOptions.n_kv_head", fmt::format("{}", n_kv_head)},
                         {"WithinOptions.n_head", fmt::format("{}", n_head)}});
  }
  non_negative("row_chunks", row_chunks);
  non_negative("max_hvps", max_hvps);
  non_negative("top_k_energy", top_k_energy);
  if (!param_regex.empty()) {
    try {
      std::regex check(param_regex);
    } catch (const std::regex_error& e) {
      throw InvalidOption(
          fmt::format("{{0}} '{}' is invalid: {}", InvalidOption::literal(param_regex),
                      InvalidOption::literal(e.what())),
          {{"WithinOptions.param_regex", ""}});
    }
  }
}

std::vector<size_t> within_selection(const ParamSpace& space, const WithinOptions& options) {
  return within_selection(space, ModelStructure::from_names(space), options);
}

std::vector<size_t> within_selection(const ParamSpace& space, const ModelStructure& structure,
                                     const WithinOptions& options) {
  options.validate();
  structure.validate(space);
  std::vector<size_t> out;
  std::regex pattern(options.param_regex.empty() ? "." : options.param_regex);
  for (size_t i = 0; i < space.size(); ++i) {
    const auto& p = space[i];
    if (p.shape.size() != 2) continue;
    const bool selected = options.param_regex.empty() ? structure.is_hidden_matrix(i, space)
                                                      : std::regex_search(p.name, pattern);
    if (selected) out.push_back(i);
  }
  return out;
}

WithinReport within_block(CurvatureEngine& engine, const ParamVector& u,
                          const WithinOptions& options) {
  const auto& space = engine.space();
  const ModelStructure structure = engine.objective().structure();
  // Key/value heads: the options', else the structure's when its query heads are the ones asked
  // for (grouped-query attention), else one per query head.
  int64_t n_kv_head = options.n_head;
  if (options.n_kv_head > 0) {
    n_kv_head = options.n_kv_head;
  } else if (structure.n_head == options.n_head && structure.n_kv_head > 0) {
    n_kv_head = structure.n_kv_head;
  }
  WithinReport report;
  const int64_t hvps_before = engine.counters().hvps;
  auto budget_left = [&](int64_t needed) {
    return options.max_hvps == 0 ||
           engine.counters().hvps - hvps_before + needed <= options.max_hvps;
  };
  // dᵀH d for a direction d that is `value` on parameter `index` and zero elsewhere: the HVP
  // starts from that parameter's gradient only and is formed on that parameter only (the one
  // part of H d the dot reads), and nothing else of d is materialised.
  auto curvature_on = [&](size_t index, const at::Tensor& value) {
    ParamVector d(u.size());
    d[index] = value.to(u[index].scalar_type());
    return dot(d, engine.hvp(d, {index}, {index}), {index});
  };
  for (size_t index : within_selection(space, structure, options)) {
    const auto& info = space[index];
    const at::Tensor U = u[index].detach().to(at::kCPU, at::kDouble);
    const int64_t rows = info.shape[0], cols = info.shape[1];
    const auto groups = groups_for(structure[index], rows, cols, options, n_kv_head);
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
      ModeTerms m;
      m.index = i;
      m.sigma = s[i];
      m.energy_share = energy > 0.0 ? s[i] * s[i] / energy : kNaN;
      m.curvature = curvature_on(index, mode);
      w.modes.push_back(m);
    }
    for (const auto& g : groups) {
      at::Tensor part = at::zeros_like(U);
      part.slice(0, g.r0, g.r1)
          .slice(1, g.c0, g.c1)
          .copy_(U.slice(0, g.r0, g.r1).slice(1, g.c0, g.c1));
      GroupTerms t;
      t.name = g.name;
      t.sq_norm = part.square().sum().item<double>();
      if (t.sq_norm > 0.0) {
        t.curvature = curvature_on(index, part.to(device));
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
