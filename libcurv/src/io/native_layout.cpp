// The native layout: DIR/step_<N>/ with model.safetensors (written last, so that a folder without
// it is an incomplete save and is skipped), optional optimizer.safetensors and meta.json.
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "curv/core/error.h"
#include "curv/io/safetensors.h"
#include "curv/io/tensor_source.h"
#include "io/builtin_layouts.h"

namespace curv {

namespace {

namespace fs = std::filesystem;

class NativeLayout : public CheckpointLayoutReader {
 public:
  std::string name() const override { return CheckpointLayout::kNative.name(); }
  std::string brief() const override { return "folders step_<N>/model.safetensors"; }
  bool holds(const std::string& path, const std::string& entry) const override {
    return entry.rfind("step_", 0) == 0 && step_number(entry.substr(5)) &&
           fs::is_regular_file(path + "/model.safetensors");
  }
  int64_t step(const std::string&, const std::string& entry) const override {
    return *step_number(entry.substr(5));
  }
  bool looks_like_one_checkpoint(const std::string& dir) const override {
    return fs::is_regular_file(dir + "/model.safetensors");
  }
  // libcurv's own layout wins: a run directory may keep exports of other tools beside it.
  bool outranks_others() const override { return true; }

  // The model stays in model.safetensors, read tensor by tensor into the parameters, and the
  // optimizer state in optimizer.safetensors, read by parameter when a step is rebuilt.
  Checkpoint open(const CheckpointInfo& info, CheckpointParts parts) const override {
    Checkpoint ckpt;
    ckpt.step = info.step;
    ckpt.path = info.path;
    ckpt.model_file = info.path + "/model.safetensors";
    ckpt.optimizer_file = info.path + "/optimizer.safetensors";
    ckpt.meta_file = info.path + "/meta.json";
    ckpt.model_source = safetensors_source({ckpt.model_file});
    if (parts == CheckpointParts::kAll && fs::exists(ckpt.optimizer_file)) {
      ckpt.optimizer_source = safetensors_source({ckpt.optimizer_file});
    }
    const std::string& meta_path = ckpt.meta_file;
    if (fs::exists(meta_path)) {
      ckpt.meta = parse_checkpoint_meta(read_text_file(meta_path), meta_path);
      if (!ckpt.meta.model_json.empty()) ckpt.model_config_file = meta_path;
      if (ckpt.meta.step && *ckpt.meta.step != info.step) {
        throw FormatError(fmt::format("{}: \"step\" is {} but the folder is step {}", meta_path,
                                      *ckpt.meta.step, info.step));
      }
    }
    return ckpt;
  }
};

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) throw FormatError(fmt::format("{}: cannot read", path));
  return out.str();
}

std::shared_ptr<const CheckpointLayoutReader> native_layout() {
  return std::make_shared<NativeLayout>();
}

}  // namespace curv
