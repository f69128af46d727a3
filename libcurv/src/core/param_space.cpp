#include "curv/core/param_space.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/fmt_torch.h"
#include "core/strings.h"
#include "curv/core/error.h"

namespace curv {

ParamSpace::ParamSpace(const std::vector<std::string>& names, const std::vector<at::Tensor>& like) {
  if (names.size() != like.size()) {
    throw InvalidArgument(
        fmt::format("ParamSpace: {} names for {} tensors", names.size(), like.size()));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (by_name_.count(names[i])) {
      throw InvalidArgument(fmt::format("ParamSpace: parameter name '{}' appears twice", names[i]));
    }
    ParamInfo info;
    info.name = names[i];
    info.shape = like[i].sizes().vec();
    info.numel = like[i].numel();
    info.offset = numel_;
    numel_ += info.numel;
    by_name_[info.name] = i;
    params_.push_back(std::move(info));
  }
}

std::vector<std::string> ParamSpace::names() const {
  std::vector<std::string> out;
  out.reserve(params_.size());
  for (const auto& p : params_) out.push_back(p.name);
  return out;
}

std::optional<size_t> ParamSpace::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

size_t ParamSpace::index(const std::string& name) const {
  if (auto i = find(name)) return *i;
  throw InvalidArgument(
      fmt::format("no parameter named '{}'{}", name, did_you_mean(name, names())));
}

namespace {

void check_aligned(const ParamVector& a, const ParamVector& b, const char* op) {
  if (a.size() != b.size()) {
    throw InvalidArgument(
        fmt::format("{}: parameter vectors of {} and {} tensors", op, a.size(), b.size()));
  }
}

// 0-dim tensors as one 1-D tensor on the first one's device: per-tensor results computed where
// the tensors live, then brought to the host in one transfer (one synchronisation).
at::Tensor stacked(const std::vector<at::Tensor>& scalars) {
  std::vector<at::Tensor> parts;
  parts.reserve(scalars.size());
  for (const auto& s : scalars) parts.push_back(s.reshape({1}).to(scalars.front().device()));
  return at::cat(parts);
}

constexpr int64_t kDotChunk = int64_t{1} << 14;
constexpr int kDotLanes = 8;

// Σ a_i b_i in float64 over chunks of kDotChunk elements, each with kDotLanes running sums (which
// the compiler keeps in vector registers), the chunks' sums added in order.
template <typename A, typename B>
double chunked_dot(const A* a, const B* b, int64_t n) {
  const int64_t chunks = (n + kDotChunk - 1) / kDotChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const int64_t begin = c * kDotChunk, end = std::min(n, begin + kDotChunk);
      double lanes[kDotLanes] = {};
      int64_t i = begin;
      for (; i + kDotLanes <= end; i += kDotLanes) {
        for (int l = 0; l < kDotLanes; ++l) lanes[l] += double(a[i + l]) * double(b[i + l]);
      }
      double sum = 0.0;
      for (; i < end; ++i) sum += double(a[i]) * double(b[i]);
      for (const double lane : lanes) sum += lane;
      partial[static_cast<size_t>(c)] = sum;
    }
  });
  return std::accumulate(partial.begin(), partial.end(), 0.0);
}

bool float_or_double(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble;
}

template <typename A>
double chunked_dot_with(const A* a, const at::Tensor& b) {
  if (b.scalar_type() == at::kFloat) return chunked_dot(a, b.data_ptr<float>(), b.numel());
  return chunked_dot(a, b.data_ptr<double>(), b.numel());
}

}  // namespace

at::Tensor float64_dot(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return {};
  if (!a.device().is_cpu() || !b.device().is_cpu() || a.sizes() != b.sizes() ||
      !float_or_double(a) || !float_or_double(b)) {
    // The products are exact (a float32 or bfloat16 product fits a double); b is promoted inside
    // the multiplication, without a float64 copy of its own. Chunks bound the float64 scratch;
    // their sums are added on the device, with no synchronisation.
    const at::Tensor af = a.reshape({-1}), bf = b.reshape({-1});
    const int64_t n = af.numel();
    constexpr int64_t kChunk = int64_t{1} << 24;
    if (n <= kChunk || a.sizes() != b.sizes()) return at::sum(a.to(at::kDouble) * b);
    at::Tensor total = at::zeros({}, af.options().dtype(at::kDouble));
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      const int64_t count = std::min(kChunk, n - begin);
      total.add_(at::sum(af.narrow(0, begin, count).to(at::kDouble) * bf.narrow(0, begin, count)));
    }
    return total;
  }
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const double value = a.scalar_type() == at::kFloat ? chunked_dot_with(ac.data_ptr<float>(), bc)
                                                     : chunked_dot_with(ac.data_ptr<double>(), bc);
  return at::scalar_tensor(value, at::TensorOptions().dtype(at::kDouble));
}

std::vector<double> dots_per_tensor(const ParamVector& a, const ParamVector& b,
                                    const std::vector<size_t>* indices) {
  check_aligned(a, b, "dot");
  std::vector<double> out(a.size(), 0.0);
  std::vector<size_t> which;
  std::vector<at::Tensor> parts;
  auto add_part = [&](size_t i) {
    // Undefined where either is (a zero: HVP terms of parameters a pass did not reach).
    at::Tensor d = float64_dot(a.at(i), b.at(i));
    if (!d.defined()) return;
    which.push_back(i);
    parts.push_back(d);
  };
  if (indices) {
    for (size_t i : *indices) add_part(i);
  } else {
    for (size_t i = 0; i < a.size(); ++i) add_part(i);
  }
  if (parts.empty()) return out;
  const at::Tensor host = stacked(parts).cpu();
  const double* values = host.data_ptr<double>();
  for (size_t k = 0; k < which.size(); ++k) out[which[k]] = values[k];
  return out;
}

double sum_over(const std::vector<double>& per_tensor, const std::vector<size_t>& indices) {
  double total = 0.0;
  for (size_t i : indices) total += per_tensor.at(i);
  return total;
}

double dot(const ParamVector& a, const ParamVector& b) {
  const std::vector<double> per_tensor = dots_per_tensor(a, b);
  return std::accumulate(per_tensor.begin(), per_tensor.end(), 0.0);
}

double dot(const ParamVector& a, const ParamVector& b, const std::vector<size_t>& indices) {
  return sum_over(dots_per_tensor(a, b, &indices), indices);
}

double squared_norm(const ParamVector& a) {
  // Each tensor's sum of squares accumulated in float64 without a float64 copy of the tensor
  // (float64_dot: one the size of a 16-bit model's embedding would be gigabytes on a GPU).
  std::vector<at::Tensor> squares;
  for (const auto& t : a) {
    at::Tensor d = float64_dot(t, t);
    if (d.defined()) squares.push_back(std::move(d));
  }
  if (squares.empty()) return 0.0;
  const at::Tensor host = stacked(squares).cpu();
  const double* values = host.data_ptr<double>();
  double total = 0.0;
  for (size_t i = 0; i < squares.size(); ++i) total += values[i];
  return total;
}

double norm(const ParamVector& a) { return std::sqrt(squared_norm(a)); }

void axpy(double alpha, const ParamVector& x, ParamVector& y) {
  check_aligned(x, y, "axpy");
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < x.size(); ++i) y[i].add_(x[i].to(y[i].scalar_type()), alpha);
}

ParamVector scaled(const ParamVector& x, double alpha) {
  ParamVector out;
  out.reserve(x.size());
  for (const auto& t : x) out.push_back(t.detach() * alpha);
  return out;
}

ParamVector add(const ParamVector& a, const ParamVector& b) {
  check_aligned(a, b, "add");
  ParamVector out;
  for (size_t i = 0; i < a.size(); ++i) out.push_back(a[i].detach() + b[i].detach());
  return out;
}

ParamVector sub(const ParamVector& a, const ParamVector& b) {
  check_aligned(a, b, "sub");
  ParamVector out;
  for (size_t i = 0; i < a.size(); ++i)
    out.push_back(a[i].detach().to(b[i].device()) - b[i].detach());
  return out;
}

ParamVector sub(const ParamVector& a, const ParamVector& b, at::ScalarType dtype) {
  check_aligned(a, b, "sub");
  ParamVector out;
  for (size_t i = 0; i < a.size(); ++i) {
    // On b's device: a may be held on the host (a next checkpoint beside a GPU's θ).
    out.push_back(a[i].detach().to(b[i].device(), dtype) - b[i].detach().to(dtype));
  }
  return out;
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return "float64";
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      return c10::toString(dtype);
  }
}

std::optional<at::ScalarType> floating_dtype_named(const std::string& name) {
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
    if (name == dtype_name(dtype)) return dtype;
  }
  return std::nullopt;
}

bool is_16_bit(at::ScalarType dtype) { return dtype == at::kBFloat16 || dtype == at::kHalf; }

at::ScalarType default_vector_dtype(at::ScalarType params) {
  return is_16_bit(params) ? at::kFloat : params;
}

at::ScalarType parse_vector_dtype(const std::string& text, at::ScalarType params,
                                  const std::string& option) {
  if (text == "auto") return default_vector_dtype(params);
  if (const auto dtype = floating_dtype_named(text)) return *dtype;
  throw InvalidArgument(
      fmt::format("{} '{}': expected auto, float64, float32, bfloat16 or float16", option, text));
}

ParamVector converted(const ParamVector& x, at::ScalarType dtype) {
  ParamVector out;
  out.reserve(x.size());
  for (const auto& t : x) out.push_back(t.defined() ? t.detach().to(dtype) : t);
  return out;
}

ParamVector zeros_like(const ParamVector& x) {
  ParamVector out;
  for (const auto& t : x) out.push_back(at::zeros_like(t, at::MemoryFormat::Contiguous));
  return out;
}

ParamVector clone(const ParamVector& x) {
  ParamVector out;
  for (const auto& t : x) out.push_back(t.detach().clone(at::MemoryFormat::Contiguous));
  return out;
}

ParamVector detached(const ParamVector& x) {
  ParamVector out;
  for (const auto& t : x) out.push_back(t.detach());
  return out;
}

ParamVector masked(const ParamVector& x, const std::vector<size_t>& indices) {
  ParamVector out = zeros_like(x);
  for (size_t i : indices) out.at(i) = x.at(i).detach();
  return out;
}

bool all_finite(const ParamVector& x) {
  std::vector<at::Tensor> flags;
  for (const auto& t : x) {
    if (t.defined() && t.is_floating_point()) flags.push_back(at::isfinite(t).all());
  }
  return flags.empty() || stacked(flags).all().item<bool>();
}

at::Tensor flat_float64(const ParamVector& x) {
  std::vector<at::Tensor> parts;
  parts.reserve(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (!x[i].defined()) {
      throw InvalidArgument(fmt::format("flat_float64: tensor {} of {} is undefined", i, x.size()));
    }
    parts.push_back(x[i].detach().reshape(-1).to(at::kDouble));
  }
  if (parts.empty()) return at::empty({0}, at::kDouble);
  return at::cat(parts);
}

void to_flat(const ParamVector& x, double* out) {
  int64_t offset = 0;
  for (const auto& t : x) {
    auto flat = t.detach().to(at::kCPU, at::kDouble).contiguous().view(-1);
    std::copy_n(flat.data_ptr<double>(), flat.numel(), out + offset);
    offset += flat.numel();
  }
}

ParamVector from_flat(const double* data, const ParamSpace& space, const ParamVector& like) {
  if (like.size() != space.size()) {
    throw InvalidArgument(
        fmt::format("from_flat: {} template tensors for a space of {}", like.size(), space.size()));
  }
  ParamVector out;
  out.reserve(space.size());
  for (size_t i = 0; i < space.size(); ++i) {
    const auto& info = space[i];
    auto cpu = at::from_blob(const_cast<double*>(data) + info.offset, info.shape,
                             at::TensorOptions().dtype(at::kDouble));
    out.push_back(cpu.to(like[i].device(), like[i].scalar_type(), /*non_blocking=*/false,
                         /*copy=*/true));
  }
  return out;
}

}  // namespace curv
