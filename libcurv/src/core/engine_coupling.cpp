// The engine's block coupling, C_lm = u_lᵀ H u_m, and the first backward whose graph it reads.
//
// Why the linear maps: block m's second backward, started from g_m·u_m, carries R(∂L/∂a) to every
// forward tensor a and R(a) to every gradient ∂L/∂a of the first backward (reverse over reverse
// gives the tangents of forward-over-reverse), where R is the derivative along u_m. For a linear
// map y = x Wᵀ + b the weight's gradient is (∂L/∂y)ᵀ x, so
//   u_Wᵀ (H u_m)_W = ⟨U, R(∂L/∂y)ᵀ x + (∂L/∂y)ᵀ R(x)⟩ = ⟨R(∂L/∂y), x Uᵀ⟩ + ⟨R(x), (∂L/∂y) U⟩.
// x Uᵀ and (∂L/∂y) U are formed once per batch; differentiating toward y and ∂L/∂x instead of W
// leaves out both products toward the weight at every layer the backward passes.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <cstddef>
#include <limits>

#include "core/engine_internal.h"
#include "core/fmt_torch.h"
#include "curv/core/error.h"

namespace curv {

namespace engine_detail {

GradientGraph first_backward(const at::Tensor& loss, const ParamVector& params,
                             std::vector<LinearUse> linears, bool with_graph) {
  using torch::autograd::impl::gradient_edge;
  GradientGraph out;
  std::vector<at::Tensor> inputs = params;
  std::vector<LinearUse> used;
  std::vector<size_t> input_of;      // per used map: its input's index in `distinct`
  std::vector<at::Tensor> distinct;  // the maps' inputs that depend on the parameters, once each
  if (with_graph) {
    for (auto& use : linears) {
      if (!use.output.defined() || !use.output.requires_grad()) continue;
      size_t input = kNoInput;
      if (use.input.requires_grad()) {
        for (size_t k = 0; k < distinct.size() && input == kNoInput; ++k) {
          if (distinct[k].unsafeGetTensorImpl() == use.input.unsafeGetTensorImpl()) input = k;
        }
        if (input == kNoInput) {
          input = distinct.size();
          distinct.push_back(use.input);
        }
      }
      input_of.push_back(input);
      used.push_back(std::move(use));
    }
    inputs.insert(inputs.end(), distinct.begin(), distinct.end());
    for (const auto& use : used) inputs.push_back(use.output);
  }
  ParamVector grads = torch::autograd::grad({loss}, inputs, {}, /*retain_graph=*/with_graph,
                                            /*create_graph=*/with_graph, /*allow_unused=*/true);
  const size_t n = params.size();
  for (size_t k = 0; k < distinct.size(); ++k) {
    const at::Tensor& dx = grads[n + k];
    out.input_grads.push_back(dx.defined() && dx.requires_grad() ? gradient_edge(dx)
                                                                 : torch::autograd::Edge());
  }
  for (size_t j = 0; j < used.size(); ++j) {
    LinearGraph map;
    map.input = used[j].input.detach();
    map.output = gradient_edge(used[j].output);
    map.output_grad = grads[n + distinct.size() + j];
    if (map.output_grad.defined()) map.output_grad = map.output_grad.detach();
    map.input_grad =
        input_of[j] != kNoInput && out.input_grads[input_of[j]].is_valid() ? input_of[j] : kNoInput;
    map.weight = used[j].weight;
    map.bias = used[j].bias;
    map.transposed = used[j].transposed;
    out.maps.push_back(std::move(map));
  }
  grads.resize(n);
  out.grads = fill_undefined(std::move(grads), params);
  return out;
}

}  // namespace engine_detail

using namespace engine_detail;

namespace {

// a·b as a 0-dim tensor accumulated in float64: on the CPU in one pass (a product tensor the size
// of an activation would cost as much again); elsewhere ATen's sum into float64 of the products,
// formed in float32 for 16-bit operands (where they are exact).
at::Tensor dot_of(const at::Tensor& a, const at::Tensor& b) {
  if (a.device().is_cpu()) return float64_dot(a, b);
  const at::Tensor wide = is_16_bit(a.scalar_type()) ? a.to(at::kFloat) : a;
  return at::sum(wide * b, at::kDouble);
}

// The second backward of `outputs` along `grad_outputs` toward the graph positions `targets`, as
// torch::autograd::grad does toward tensors: unreached targets give undefined tensors.
ParamVector backward_to(const std::vector<at::Tensor>& outputs,
                        const std::vector<at::Tensor>& grad_outputs,
                        const torch::autograd::edge_list& targets) {
  torch::autograd::edge_list roots;
  for (const auto& o : outputs) roots.push_back(torch::autograd::impl::gradient_edge(o));
  return torch::autograd::Engine::get_default_engine().execute(
      roots, grad_outputs, /*keep_graph=*/true, /*create_graph=*/false,
      /*accumulate_grad=*/false, targets);
}

// One slice's u_lᵀ (H d_k)_l for each product k and block l ≥ its first block, in M(l, k);
// `nonzero[l]`: u_l ≠ 0.
Eigen::MatrixXd slice_products(const GradientGraph& graph, const ParamVector& params,
                               const BlockReader& reader,
                               const std::vector<std::vector<size_t>>& blocks,
                               const std::vector<BlockProduct>& products, bool read_maps,
                               int64_t& second_backwards) {
  const ParamVector& v = reader.v;
  const std::vector<int64_t>& block_of = reader.block_of;
  const std::vector<bool>& nonzero = reader.nonzero;
  using torch::autograd::impl::gradient_edge;
  const size_t L = blocks.size();
  Eigen::MatrixXd c = Eigen::MatrixXd::Zero(static_cast<Eigen::Index>(L),
                                            static_cast<Eigen::Index>(products.size()));
  std::vector<char> listed(params.size(), 0);
  // Per map: the block of its weight and of its bias where u is nonzero there (else -1), x Uᵀ
  // and (∂L/∂y) U.
  struct MapTerms {
    int64_t weight_block = -1, bias_block = -1;
    at::Tensor z, a;
  };
  std::vector<MapTerms> maps(read_maps ? graph.maps.size() : 0);
  {
    c10::NoGradGuard no_grad;
    for (size_t j = 0; j < maps.size(); ++j) {
      const LinearGraph& map = graph.maps[j];
      listed[map.weight] = 1;
      if (map.bias != LinearUse::kNoBias) listed[map.bias] = 1;
      MapTerms& t = maps[j];
      const int64_t wb = block_of[map.weight];
      if (wb >= 0 && nonzero[static_cast<size_t>(wb)]) {
        t.weight_block = wb;
        const at::Tensor& U = v[map.weight];
        t.z = at::matmul(map.input, map.transposed ? U : U.t());
        if (map.input_grad != kNoInput && map.output_grad.defined()) {
          t.a = at::matmul(map.output_grad, map.transposed ? U.t() : U);
        }
      }
      if (map.bias != LinearUse::kNoBias) {
        const int64_t bb = block_of[map.bias];
        if (bb >= 0 && nonzero[static_cast<size_t>(bb)]) t.bias_block = bb;
      }
    }
  }
  for (size_t k_product = 0; k_product < products.size(); ++k_product) {
    const BlockProduct& product = products[k_product];
    std::vector<at::Tensor> outputs, grad_outputs;
    for (size_t i : product.support) {
      if (graph.grads[i].requires_grad()) {
        outputs.push_back(graph.grads[i]);
        grad_outputs.push_back((*product.direction)[i]);
      }
    }
    if (outputs.empty()) continue;
    const auto m = product.first_block;
    const auto mi = static_cast<int64_t>(m);
    const auto column = static_cast<Eigen::Index>(k_product);
    // What the second backward differentiates toward: parameters of blocks ≥ m that no listed
    // map covers, the outputs of maps with a weight or bias there, and their inputs' gradients.
    torch::autograd::edge_list targets;
    std::vector<size_t> params_asked, maps_asked, inputs_asked;
    for (size_t l = m; l < L; ++l) {
      if (!nonzero[l]) continue;
      for (size_t i : blocks[l]) {
        if (listed[i] == 0) {
          targets.push_back(gradient_edge(params[i]));
          params_asked.push_back(i);
        }
      }
    }
    std::vector<char> input_asked(graph.input_grads.size(), 0);
    for (size_t j = 0; j < maps.size(); ++j) {
      const bool weight = maps[j].weight_block >= mi, bias = maps[j].bias_block >= mi;
      if (!weight && !bias) continue;
      targets.push_back(graph.maps[j].output);
      maps_asked.push_back(j);
      const size_t x = graph.maps[j].input_grad;
      if (weight && maps[j].a.defined() && input_asked[x] == 0) {
        input_asked[x] = 1;
        inputs_asked.push_back(x);
      }
    }
    for (size_t x : inputs_asked) targets.push_back(graph.input_grads[x]);
    if (targets.empty()) continue;
    const ParamVector parts = backward_to(outputs, grad_outputs, targets);
    ++second_backwards;
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> values;
    std::vector<int64_t> rows;
    auto add = [&](int64_t row, const at::Tensor& value) {
      values.push_back(value.to(at::kDouble).reshape({1}));
      rows.push_back(row);
    };
    size_t k = 0;
    for (size_t i : params_asked) {
      const at::Tensor& h = parts[k++];
      if (h.defined()) add(block_of[i], dot_of(h, v[i]));
    }
    for (size_t j : maps_asked) {
      const at::Tensor& r_dy = parts[k++];  // R(∂L/∂y)
      if (!r_dy.defined()) continue;
      if (maps[j].weight_block >= mi) add(maps[j].weight_block, dot_of(r_dy, maps[j].z));
      if (maps[j].bias_block >= mi) {
        const at::Tensor& U_b = v[graph.maps[j].bias];
        add(maps[j].bias_block, dot_of(r_dy.reshape({-1, r_dy.size(-1)}).sum(0), U_b));
      }
    }
    for (size_t x : inputs_asked) {
      const at::Tensor& r_x = parts[k++];  // R(x)
      if (!r_x.defined()) continue;
      for (size_t j = 0; j < maps.size(); ++j) {
        if (graph.maps[j].input_grad == x && maps[j].weight_block >= mi && maps[j].a.defined()) {
          add(maps[j].weight_block, dot_of(r_x, maps[j].a));
        }
      }
    }
    if (values.empty()) continue;
    const at::Tensor host = at::cat(values).cpu();
    const double* d = host.data_ptr<double>();
    for (size_t q = 0; q < rows.size(); ++q) c(rows[q], column) += d[q];
  }
  return c;
}

// C(m, l) = C(l, m) for l > m.
void mirror_lower(Eigen::MatrixXd& c) {
  for (Eigen::Index l = 0; l < c.rows(); ++l) {
    for (Eigen::Index m = 0; m < l; ++m) c(m, l) = c(l, m);
  }
}

}  // namespace

BlockReader CurvatureEngine::read_blocks(const ParamVector& u,
                                         const std::vector<std::vector<size_t>>& blocks,
                                         const char* what) const {
  const auto& s = *state_;
  const size_t n = s.params.size(), L = blocks.size();
  if (u.size() != n) {
    throw InvalidArgument(
        fmt::format("{}: direction of {} tensors for {} parameters", what, u.size(), n));
  }
  BlockReader r;
  r.block_of.assign(n, -1);
  r.v.resize(n);
  std::vector<size_t> listed;  // the valid indices (the loop below names an invalid one)
  for (const auto& block : blocks) {
    for (size_t i : block) {
      if (i < n) listed.push_back(i);
    }
  }
  r.scale = tangent_scale(u, listed);
  for (size_t l = 0; l < L; ++l) {
    for (size_t i : blocks[l]) {
      if (i >= n) {
        throw InvalidArgument(
            fmt::format("{}: block {} lists parameter index {} for {} parameters", what, l, i, n));
      }
      if (r.block_of[i] >= 0) {
        throw InvalidArgument(fmt::format("{}: parameter '{}' is in blocks {} and {}", what,
                                          space()[i].name, r.block_of[i], l));
      }
      r.block_of[i] = static_cast<int64_t>(l);
      r.v[i] = on_parameter(u, i, what, r.scale);
      r.covered.push_back(i);
    }
  }
  const std::vector<double> sq = dots_per_tensor(r.v, r.v, &r.covered);
  r.nonzero.assign(L, false);
  for (size_t l = 0; l < L; ++l) r.nonzero[l] = sum_over(sq, blocks[l]) != 0.0;
  return r;
}

double CurvatureEngine::tangent_scale(const ParamVector& x,
                                      const std::vector<size_t>& indices) const {
  if (parameter_dtype() != at::kHalf || options_.hvp_method != HvpMethod::kExact) return 1.0;
  std::vector<at::Tensor> maxima;
  for (size_t i : indices) {
    // max(max x, −min x): no |x| copy of the tensor.
    if (x.at(i).defined() && x[i].numel() > 0) {
      const at::Tensor t = x[i].detach();
      maxima.push_back(at::maximum(t.max(), t.min().neg()).to(at::kDouble));
    }
  }
  if (maxima.empty()) return 1.0;
  const double largest = at::stack(maxima).max().item<double>();
  if (!(largest > 0) || !std::isfinite(largest)) return 1.0;
  return std::ldexp(1.0, -static_cast<int>(std::ceil(std::log2(largest))));
}

at::Tensor CurvatureEngine::on_parameter(const ParamVector& x, size_t i, const char* what,
                                         double scale) const {
  const at::Tensor& p = state_->params[i];
  if (!x[i].defined() || !x[i].sizes().equals(p.sizes())) {
    throw InvalidArgument(fmt::format(
        "{}: tensor for '{}' has shape {}, the parameter {}", what, space()[i].name,
        x[i].defined() ? fmt::format("{}", x[i].sizes()) : std::string("(undefined)"), p.sizes()));
  }
  const at::Tensor t = x[i].detach();
  return (scale == 1.0 ? t : t * scale).to(p.device(), p.scalar_type());
}

Eigen::MatrixXd CurvatureEngine::block_products(const BlockReader& reader,
                                                const std::vector<std::vector<size_t>>& blocks,
                                                const std::vector<BlockProduct>& products,
                                                bool symmetric, const CouplingObserver& observer) {
  auto& s = *state_;
  // Layer-wise products need no cached gradient: they form the slice's own.
  const bool needs_first_order = !s.have_first_order || (options_.reuse_graph && !s.graphs_current);
  if (needs_first_order && !options_.recompute_layers) compute_first_order(options_.reuse_graph);
  Stopwatch timer(counters_.seconds);
  const auto L = static_cast<Eigen::Index>(blocks.size());
  const auto K = static_cast<Eigen::Index>(products.size());
  Eigen::MatrixXd total = Eigen::MatrixXd::Zero(L, K);
  for_each_batch(Pass::kHvp, [&](size_t b, double w_b) {
    Eigen::MatrixXd m_b = Eigen::MatrixXd::Zero(L, K);
    Eigen::VectorXd first_b = Eigen::VectorXd::Zero(L);
    for (size_t k = 0; k < s.slices[b].size(); ++k) {
      const Slice& slice = s.slices[b][k];
      if (options_.recompute_layers) {
        Eigen::VectorXd first_s;
        int64_t passes = 0;
        m_b += slice.share * staged_block_products(objective_, slice.batch, s.params, reader,
                                                   blocks.size(), products,
                                                   observer ? &first_s : nullptr, passes);
        if (observer) first_b += slice.share * first_s;
        counters_.forwards += 2 * passes;
        counters_.backwards += passes;
        counters_.second_backwards += passes;
        continue;
      }
      release_graphs_over_budget();
      GradientGraph fresh;
      const bool kept = !s.kept[b][k].empty();
      if (!kept) {
        std::vector<LinearUse> linears;
        const at::Tensor loss_s = objective_.loss_listing_linears(slice.batch, linears);
        ++counters_.forwards;
        fresh = first_backward(loss_s, s.params, std::move(linears), /*with_graph=*/true);
        ++counters_.backwards;
      }
      const GradientGraph& graph = kept ? s.kept[b][k] : fresh;
      // x Uᵀ and (∂L/∂y) U cost about what reading the maps saves on one product's backward:
      // worth it when several products share them.
      const bool read_maps = products.size() > 1;
      m_b += slice.share * slice_products(graph, s.params, reader, blocks, products, read_maps,
                                          counters_.second_backwards);
      if (observer) {
        const std::vector<double> gu =
            dots_per_tensor(detached(graph.grads), reader.v, &reader.covered);
        for (Eigen::Index l = 0; l < L; ++l) {
          first_b(l) += slice.share * sum_over(gu, blocks[static_cast<size_t>(l)]);
        }
      }
      fresh.clear();
      release_graphs_over_budget();
    }
    // Back from the scaled directions (tangent_scale): exact, by powers of two.
    for (Eigen::Index k = 0; k < K; ++k) {
      m_b.col(k) /= reader.scale * products[static_cast<size_t>(k)].scale;
    }
    first_b /= reader.scale;
    if (symmetric) mirror_lower(m_b);
    if (options_.check_finite && !m_b.allFinite()) {
      throw NumericalError(
          fmt::format("the block products of {} hold NaN or Inf on probe batch {} (hint: check the "
                      "checkpoint and the direction for NaN, or use float64)",
                      objective_.describe(), b));
    }
    if (observer) observer(CouplingTerms{b, w_b, &first_b, &m_b});
    total += w_b * m_b;
  });
  sum_over_ranks(total.data(), static_cast<size_t>(total.size()));
  for (const auto& p : products) counters_.hvps += p.support.empty() ? 0 : 1;
  return total;
}

Eigen::MatrixXd CurvatureEngine::coupling(const ParamVector& u,
                                          const std::vector<std::vector<size_t>>& blocks,
                                          const CouplingObserver& observer) {
  const BlockReader reader = read_blocks(u, blocks, "coupling");
  if (options_.hvp_method == HvpMethod::kFiniteDifference) {
    return coupling_finite_difference(reader.v, blocks, reader.nonzero, observer);
  }
  // Block m's product, read on blocks l ≥ m; blocks where u is zero form none.
  std::vector<BlockProduct> products(blocks.size());
  for (size_t m = 0; m < blocks.size(); ++m) {
    products[m].direction = &reader.v;
    if (reader.nonzero[m]) products[m].support = blocks[m];
    products[m].first_block = m;
    products[m].scale = reader.scale;
  }
  return block_products(reader, blocks, products, /*symmetric=*/true, observer);
}

Eigen::VectorXd CurvatureEngine::block_row(const ParamVector& u,
                                           const std::vector<std::vector<size_t>>& blocks,
                                           const ParamVector& w, const CouplingObserver& observer) {
  const BlockReader reader = read_blocks(u, blocks, "block_row");
  ParamVector d(reader.v.size());
  const double w_scale = tangent_scale(w, reader.covered);
  for (size_t i : reader.covered) d[i] = on_parameter(w, i, "block_row", w_scale);
  if (options_.hvp_method == HvpMethod::kExact) {
    const std::vector<BlockProduct> product{{&d, reader.covered, 0, w_scale}};
    return block_products(reader, blocks, product, /*symmetric=*/false, observer).col(0);
  }
  const auto L = static_cast<Eigen::Index>(blocks.size());
  auto per_block = [&](const ParamVector& hw) {
    const std::vector<double> uh = dots_per_tensor(reader.v, hw, &reader.covered);
    Eigen::VectorXd out(L);
    for (Eigen::Index l = 0; l < L; ++l) out(l) = sum_over(uh, blocks[static_cast<size_t>(l)]);
    return out;
  };
  BatchObserver batch_observer;
  if (observer) {
    batch_observer = [&](const BatchTerms& bt) {
      const Eigen::MatrixXd m_b = per_block(*bt.hvp);
      const std::vector<double> gu = dots_per_tensor(*bt.gradient, reader.v, &reader.covered);
      Eigen::VectorXd first_b(L);
      for (Eigen::Index l = 0; l < L; ++l)
        first_b(l) = sum_over(gu, blocks[static_cast<size_t>(l)]);
      observer(CouplingTerms{bt.batch, bt.weight, &first_b, &m_b});
    };
  }
  return per_block(hvp(d, reader.covered, batch_observer));
}

Eigen::MatrixXd CurvatureEngine::coupling_finite_difference(
    const ParamVector& v, const std::vector<std::vector<size_t>>& blocks,
    const std::vector<bool>& nonzero, const CouplingObserver& observer) {
  const size_t L = blocks.size(), B = probe_.size();
  const auto Le = static_cast<Eigen::Index>(L);
  std::vector<Eigen::MatrixXd> c_b(B, Eigen::MatrixXd::Zero(Le, Le));
  std::vector<Eigen::VectorXd> first_b(B, Eigen::VectorXd::Zero(Le));
  Eigen::MatrixXd total = Eigen::MatrixXd::Zero(Le, Le);
  std::vector<size_t> covered;
  for (const auto& block : blocks) covered.insert(covered.end(), block.begin(), block.end());
  bool first = true;
  for (size_t m = 0; m < L; ++m) {
    if (!nonzero[m]) continue;
    std::vector<size_t> targets;
    for (size_t l = m; l < L; ++l) {
      if (nonzero[l]) targets.insert(targets.end(), blocks[l].begin(), blocks[l].end());
    }
    const auto mi = static_cast<Eigen::Index>(m);
    BatchObserver batch_observer;
    if (observer) {
      batch_observer = [&](const BatchTerms& bt) {
        const std::vector<double> uh = dots_per_tensor(v, *bt.hvp, &targets);
        for (size_t l = m; l < L; ++l) {
          c_b[bt.batch](static_cast<Eigen::Index>(l), mi) = sum_over(uh, blocks[l]);
        }
        if (!first) return;
        const std::vector<double> gu = dots_per_tensor(*bt.gradient, v, &covered);
        for (size_t l = 0; l < L; ++l) {
          first_b[bt.batch](static_cast<Eigen::Index>(l)) = sum_over(gu, blocks[l]);
        }
      };
    }
    const ParamVector h = hvp(v, blocks[m], targets, batch_observer);
    const std::vector<double> uh = dots_per_tensor(v, h, &targets);
    for (size_t l = m; l < L; ++l)
      total(static_cast<Eigen::Index>(l), mi) = sum_over(uh, blocks[l]);
    first = false;
  }
  mirror_lower(total);
  if (observer) {
    for (size_t b = first_batch_; b < last_batch_; ++b) {
      mirror_lower(c_b[b]);
      observer(CouplingTerms{b, probe_.weight(b), &first_b[b], &c_b[b]});
    }
  }
  return total;
}

}  // namespace curv
