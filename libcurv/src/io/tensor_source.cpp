// The safetensors source: files read tensor by tensor out of their mappings.
#include "curv/io/tensor_source.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>

#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/io/safetensors.h"

namespace curv {

namespace {

class SafetensorsSource : public TensorSource {
 public:
  SafetensorsSource(const std::vector<std::string>& files, std::string origin)
      : origin_(std::move(origin)) {
    if (origin_.empty()) origin_ = files.size() == 1 ? files.front() : join(files, ", ");
    for (const auto& file : files) {
      readers_.emplace_back(file);
      const SafetensorsReader& r = readers_.back();
      for (const auto& name : r.names()) {
        const auto [it, fresh] = index_.emplace(name, readers_.size() - 1);
        if (!fresh) {
          throw FormatError(fmt::format("tensor '{}' is in both {} and {}", name,
                                        readers_[it->second].path(), file));
        }
        entries_.push_back({name, r.entry(name).shape, r.scalar_type(name)});
      }
    }
  }
  const std::vector<TensorEntry>& entries() const override { return entries_; }
  std::string origin() const override { return origin_; }
  void read_into(const std::string& name, const std::vector<int64_t>& offsets,
                 at::Tensor dest) const override {
    check_read_box(*this, find(name), name, offsets, dest);
    const auto it = index_.find(name);
    const SafetensorsReader& r = readers_[it->second];
    copy_read_box(r.tensor(name), offsets, dest);
    r.release(name);
  }

 private:
  std::string origin_;
  std::vector<SafetensorsReader> readers_;
  std::vector<TensorEntry> entries_;
  std::map<std::string, size_t> index_;  // name → reader
};

}  // namespace

SharedTensorSource safetensors_source(const std::vector<std::string>& files, std::string origin) {
  return std::make_shared<SafetensorsSource>(files, std::move(origin));
}

}  // namespace curv
