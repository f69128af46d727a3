// Tensor sources: the interface's helpers, tensors in memory, and renamed or sliced views.
#include "curv/core/tensor_source.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>

#include "core/strings.h"
#include "curv/core/error.h"

namespace curv {

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorEntry::bytes() const {
  return numel() * static_cast<int64_t>(c10::elementSize(dtype));
}

const TensorEntry* TensorSource::find(const std::string& name) const {
  const auto& all = entries();
  std::call_once(index_once_, [&] {
    for (size_t i = 0; i < all.size(); ++i) index_.emplace(all[i].name, i);
  });
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &all[it->second];
}

at::Tensor TensorSource::read(const std::string& name) const {
  const TensorEntry* e = find(name);
  if (e == nullptr) {
    throw InvalidArgument(fmt::format("{}: no tensor '{}'", origin(), name));
  }
  at::Tensor out = at::empty(e->shape, at::TensorOptions().dtype(e->dtype));
  read_into(name, {}, out);
  return out;
}

int64_t TensorSource::total_bytes() const {
  int64_t total = 0;
  for (const auto& e : entries()) total += e.bytes();
  return total;
}

std::vector<std::pair<std::string, at::Tensor>> read_all(const TensorSource& source) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(source.entries().size());
  for (const auto& e : source.entries()) out.emplace_back(e.name, source.read(e.name));
  return out;
}

int64_t copy_box_overlap(const at::Tensor& chunk, const std::vector<int64_t>& chunk_offsets,
                         at::Tensor& dest, const std::vector<int64_t>& dest_offsets) {
  at::Tensor from = chunk, to = dest;
  int64_t count = 1;
  for (int64_t d = 0; d < dest.dim(); ++d) {
    const size_t k = static_cast<size_t>(d);
    const int64_t c0 = chunk_offsets[k], c1 = c0 + chunk.size(d);
    const int64_t d0 = dest_offsets.empty() ? 0 : dest_offsets[k], d1 = d0 + dest.size(d);
    const int64_t lo = std::max(c0, d0), hi = std::min(c1, d1);
    if (hi <= lo) return 0;
    from = from.narrow(d, lo - c0, hi - lo);
    to = to.narrow(d, lo - d0, hi - lo);
    count *= hi - lo;
  }
  to.copy_(from);
  return count;
}

// The box check every source makes before reading.
void check_read_box(const TensorSource& source, const TensorEntry* e, const std::string& name,
                    const std::vector<int64_t>& offsets, const at::Tensor& dest) {
  if (e == nullptr) throw InvalidArgument(fmt::format("{}: no tensor '{}'", source.origin(), name));
  const auto sizes = dest.sizes().vec();
  bool inside =
      sizes.size() == e->shape.size() && (offsets.empty() || offsets.size() == sizes.size());
  for (size_t d = 0; inside && d < sizes.size(); ++d) {
    const int64_t at = offsets.empty() ? 0 : offsets[d];
    inside = at >= 0 && sizes[d] >= 0 && at + sizes[d] <= e->shape[d];
  }
  if (!inside) {
    throw InvalidArgument(fmt::format(
        "{}: tensor '{}' of shape {}: the box at {} of size {} does "
        "not lie inside it",
        source.origin(), name, shape_string(e->shape), shape_string(offsets), shape_string(sizes)));
  }
}

void copy_read_box(const at::Tensor& t, const std::vector<int64_t>& offsets, at::Tensor& dest) {
  at::Tensor from = t;
  for (int64_t d = 0; d < dest.dim() && !offsets.empty(); ++d) {
    from = from.narrow(d, offsets[static_cast<size_t>(d)], dest.size(d));
  }
  dest.copy_(from);
}

namespace {

class MemorySource : public TensorSource {
 public:
  MemorySource(std::vector<std::pair<std::string, at::Tensor>> tensors, std::string origin)
      : tensors_(std::move(tensors)), origin_(std::move(origin)) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& [name, t] = tensors_[i];
      if (!index_.emplace(name, i).second) {
        throw InvalidArgument(fmt::format("{}: tensor '{}' is given twice", origin_, name));
      }
      entries_.push_back({name, t.sizes().vec(), t.scalar_type()});
    }
  }
  const std::vector<TensorEntry>& entries() const override { return entries_; }
  std::string origin() const override { return origin_; }
  void read_into(const std::string& name, const std::vector<int64_t>& offsets,
                 at::Tensor dest) const override {
    const auto it = index_.find(name);
    check_read_box(*this, it == index_.end() ? nullptr : &entries_[it->second], name, offsets,
                   dest);
    copy_read_box(tensors_[it->second].second, offsets, dest);
  }

 private:
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
  std::string origin_;
  std::vector<TensorEntry> entries_;
  std::map<std::string, size_t> index_;
};

// Parts of a base source's tensors under names of their own: renamed whole tensors, and boxes of
// them with their leading dimensions selected (one expert of a fused expert tensor).
class SlicedSource : public TensorSource {
 public:
  SlicedSource(SharedTensorSource base, std::vector<TensorSlice> slices) : base_(std::move(base)) {
    for (auto& s : slices) {
      const TensorEntry* e = base_->find(s.in_base);
      if (e == nullptr) {
        throw InvalidArgument(fmt::format("{}: no tensor '{}'", base_->origin(), s.in_base));
      }
      if (s.offsets.empty() && s.shape.empty()) {
        s.offsets.assign(e->shape.size(), 0);
        s.shape = e->shape;
      }
      if (!fits(s, *e)) {
        throw InvalidArgument(fmt::format(
            "{}: tensor '{}' of shape {}: the slice '{}' at {} of shape {} does not lie inside it",
            base_->origin(), s.in_base, shape_string(e->shape), s.name, shape_string(s.offsets),
            shape_string(s.shape)));
      }
      if (!index_.emplace(s.name, slices_.size()).second) {
        throw InvalidArgument(
            fmt::format("{}: tensor '{}' is given twice", base_->origin(), s.name));
      }
      entries_.push_back({s.name, s.shape, e->dtype});
      slices_.push_back(std::move(s));
    }
  }
  const std::vector<TensorEntry>& entries() const override { return entries_; }
  std::string origin() const override { return base_->origin(); }
  void read_into(const std::string& name, const std::vector<int64_t>& offsets,
                 at::Tensor dest) const override {
    const auto it = index_.find(name);
    check_read_box(*this, it == index_.end() ? nullptr : &entries_[it->second], name, offsets,
                   dest);
    const TensorSlice& s = slices_[it->second];
    const size_t dropped = s.offsets.size() - s.shape.size();
    std::vector<int64_t> at = s.offsets;
    for (size_t d = 0; d < s.shape.size() && !offsets.empty(); ++d) at[dropped + d] += offsets[d];
    for (size_t d = 0; d < dropped; ++d) dest = dest.unsqueeze(0);
    base_->read_into(s.in_base, at, dest);
  }

 private:
  // One offset per base dimension; the dropped leading ones select a single index.
  static bool fits(const TensorSlice& s, const TensorEntry& e) {
    if (s.offsets.size() != e.shape.size() || s.shape.size() > e.shape.size()) return false;
    const size_t dropped = e.shape.size() - s.shape.size();
    for (size_t d = 0; d < e.shape.size(); ++d) {
      const int64_t size = d < dropped ? 1 : s.shape[d - dropped];
      if (s.offsets[d] < 0 || size < 0 || s.offsets[d] + size > e.shape[d]) return false;
    }
    return true;
  }

  SharedTensorSource base_;
  std::vector<TensorEntry> entries_;
  std::vector<TensorSlice> slices_;
  std::map<std::string, size_t> index_;
};

}  // namespace

SharedTensorSource renamed_tensor_source(SharedTensorSource base,
                                         std::vector<std::pair<std::string, std::string>> names) {
  std::vector<TensorSlice> slices;
  slices.reserve(names.size());
  for (auto& [name, in_base] : names)
    slices.push_back({std::move(name), std::move(in_base), {}, {}});
  return sliced_tensor_source(std::move(base), std::move(slices));
}

SharedTensorSource sliced_tensor_source(SharedTensorSource base, std::vector<TensorSlice> slices) {
  return std::make_shared<SlicedSource>(std::move(base), std::move(slices));
}

SharedTensorSource memory_tensor_source(std::vector<std::pair<std::string, at::Tensor>> tensors,
                                        std::string origin) {
  return std::make_shared<MemorySource>(std::move(tensors), std::move(origin));
}

}  // namespace curv
