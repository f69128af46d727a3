#include "curv/core/probe_set.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "core/fmt_torch.h"
#include "curv/core/error.h"

namespace curv {

ProbeSet::ProbeSet(std::vector<Batch> batches) : batches_(std::move(batches)) {
  for (size_t i = 0; i < batches_.size(); ++i) {
    const auto& b = batches_[i];
    if (!b.inputs.defined() || !b.targets.defined()) {
      throw InvalidArgument(fmt::format("probe set: batch {} has undefined inputs or targets", i));
    }
    if (b.inputs.dim() == 0 || b.targets.dim() == 0 || b.inputs.size(0) != b.targets.size(0)) {
      throw InvalidArgument(
          fmt::format("probe set: batch {} has inputs of shape {} and targets of "
                      "shape {}; their first dimensions (examples) must agree",
                      i, b.inputs.sizes(), b.targets.sizes()));
    }
    if (b.size() == 0) throw InvalidArgument(fmt::format("probe set: batch {} is empty", i));
    num_examples_ += b.size();
  }
}

ProbeSet ProbeSet::split(const at::Tensor& inputs, const at::Tensor& targets, int64_t batch_size) {
  if (inputs.dim() == 0 || targets.dim() == 0 || inputs.size(0) != targets.size(0)) {
    throw InvalidArgument(
        fmt::format("probe set: inputs of shape {} and targets of shape {} do not "
                    "share their first dimension",
                    inputs.sizes(), targets.sizes()));
  }
  const int64_t n = inputs.size(0);
  if (batch_size <= 0) batch_size = n;
  std::vector<Batch> batches;
  for (int64_t start = 0; start < n; start += batch_size) {
    const int64_t len = std::min(batch_size, n - start);
    batches.push_back(Batch{inputs.narrow(0, start, len), targets.narrow(0, start, len)});
  }
  return ProbeSet(std::move(batches));
}

ProbeSet ProbeSet::shards(const Batch& batch, int count) {
  if (count < 1) throw InvalidArgument(fmt::format("ProbeSet::shards: count {}", count));
  if (count == 1) return ProbeSet({batch});
  const int64_t n = batch.size();
  return split(batch.inputs, batch.targets, (n + count - 1) / count);
}

double ProbeSet::weight(size_t i) const {
  return static_cast<double>(batches_.at(i).size()) / static_cast<double>(num_examples_);
}

ProbeSet ProbeSet::to(at::ScalarType dtype, c10::Device device) const {
  std::vector<Batch> out;
  auto convert = [&](const at::Tensor& t) {
    return t.is_floating_point() ? t.to(device, dtype) : t.to(device);
  };
  for (const auto& b : batches_) out.push_back(Batch{convert(b.inputs), convert(b.targets)});
  return ProbeSet(std::move(out));
}

std::string ProbeSet::hash() const {
  // FNV-1a over shapes, dtypes and bytes: stable across runs and platforms of one endianness.
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](const void* data, size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= bytes[i];
      h *= 1099511628211ULL;
    }
  };
  for (const auto& b : batches_) {
    for (const auto* t : {&b.inputs, &b.targets}) {
      auto c = t->to(at::kCPU).contiguous();
      for (auto d : c.sizes()) mix(&d, sizeof d);
      const int8_t type = static_cast<int8_t>(c.scalar_type());
      mix(&type, 1);
      mix(c.data_ptr(), c.numel() * c.element_size());
    }
  }
  return fmt::format("{:016x}", h);
}

}  // namespace curv
