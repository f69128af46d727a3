#include "curv/io/probe_data.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>

#include "core/fmt_torch.h"
#include "curv/core/error.h"
#include "curv/io/safetensors.h"
#include "curv/io/token_data.h"

namespace curv {

void ProbeDataOptions::validate() const {
  if (batch_size <= 0) {
    throw InvalidArgument(fmt::format("probe batch size {} must be > 0", batch_size));
  }
  if (max_examples < 0) {
    throw InvalidArgument(fmt::format("probe max examples {} must be >= 0", max_examples));
  }
}

ProbeSet load_probe_data(const std::string& path, const ProbeDataOptions& options) {
  options.validate();
  SafetensorsReader reader(path);
  for (const char* key : {"inputs", "targets"}) {
    if (!reader.contains(key)) {
      throw FormatError(
          fmt::format("probe data '{}' has no tensor '{}' (it needs 'inputs' and "
                      "'targets', first dimension = examples)",
                      path, key));
    }
  }
  at::Tensor inputs = reader.tensor("inputs"), targets = reader.tensor("targets");
  if (inputs.dim() == 0 || targets.dim() == 0 || inputs.size(0) != targets.size(0)) {
    throw FormatError(
        fmt::format("probe data '{}': 'inputs' {} and 'targets' {} must share their "
                    "first dimension (examples)",
                    path, inputs.sizes(), targets.sizes()));
  }
  if (inputs.size(0) == 0) throw FormatError(fmt::format("probe data '{}' has no examples", path));
  if (options.max_examples > 0 && options.max_examples < inputs.size(0)) {
    inputs = inputs.narrow(0, 0, options.max_examples);
    targets = targets.narrow(0, 0, options.max_examples);
  }
  // Integer ids of any width become int64, as embedding and cross-entropy expect.
  if (!inputs.is_floating_point()) inputs = inputs.to(at::kLong);
  if (!targets.is_floating_point()) targets = targets.to(at::kLong);
  return ProbeSet::split(inputs, targets, options.batch_size);
}

ProbeSet load_token_probe_data(const std::string& path, int64_t block_size, int64_t examples,
                               int64_t batch_size, uint64_t seed) {
  if (block_size <= 0 || examples <= 0) {
    throw InvalidArgument(
        fmt::format("token probe data '{}': block size {} and examples {} must "
                    "be > 0",
                    path, block_size, examples));
  }
  const TokenData tokens = TokenData::from_uint16_file(path);
  auto [inputs, targets] = tokens.windows(examples, block_size, seed);
  return ProbeSet::split(inputs, targets, batch_size);
}

bool ProbeDataSource::token_file() const {
  return std::filesystem::path(path).extension() == ".bin";
}

void ProbeDataSource::validate() const {
  if (path.empty())
    throw InvalidOption("no probe data: {0} names no file (FILE.safetensors or FILE.bin)",
                        {{"ProbeDataSource.path", ""}});
  if (token_file() && (block_size == 0 || options.max_examples == 0)) {
    throw InvalidOption(
        fmt::format("probe data {}: a uint16 token file needs the window length {{0}} and the "
                    "window count {{1}} set (> 0)",
                    InvalidOption::literal(path)),
        {{"ProbeDataSource.block_size", fmt::format("{}", block_size)},
         {"ProbeDataOptions.max_examples", fmt::format("{}", options.max_examples)}});
  }
  if (!token_file() && block_size != 0) {
    throw InvalidArgument(
        fmt::format("probe data {}: ProbeDataSource.block_size = {} applies to "
                    "uint16 token files (.bin) only",
                    path, block_size));
  }
  options.validate();
}

ProbeSet ProbeDataSource::load() const {
  validate();
  return token_file() ? load_token_probe_data(path, block_size, options.max_examples,
                                              options.batch_size, seed)
                      : load_probe_data(path, options);
}

}  // namespace curv
