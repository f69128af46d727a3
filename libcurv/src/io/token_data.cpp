#include "curv/io/token_data.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "core/splitmix.h"
#include "curv/core/error.h"

namespace curv {

TokenData::TokenData(std::vector<int64_t> tokens, std::string source)
    : tokens_(std::move(tokens)), source_(std::move(source)) {
  for (int64_t t : tokens_) {
    if (t < 0) throw InvalidArgument(fmt::format("{}: negative token id {}", source_, t));
    max_token_ = std::max(max_token_, t);
  }
}

TokenData TokenData::from_uint16_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw FormatError(fmt::format("cannot open token file '{}'", path));
  const std::streamsize bytes = in.tellg();
  if (bytes % 2 != 0) {
    throw FormatError(
        fmt::format("token file '{}' has {} bytes, not a whole number of uint16 "
                    "tokens",
                    path, bytes));
  }
  if (bytes == 0) throw FormatError(fmt::format("token file '{}' is empty", path));
  in.seekg(0);
  std::vector<unsigned char> raw(static_cast<size_t>(bytes));
  in.read(reinterpret_cast<char*>(raw.data()), bytes);
  std::vector<int64_t> tokens(raw.size() / 2);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = raw[2 * i] | (raw[2 * i + 1] << 8);
  return TokenData(std::move(tokens), path);
}

std::pair<at::Tensor, at::Tensor> TokenData::windows(int64_t count, int64_t t,
                                                     uint64_t seed) const {
  if (t <= 0 || count <= 0) {
    throw InvalidArgument(fmt::format("windows: count {} and length {} must be > 0", count, t));
  }
  if (size() < t + 1) {
    throw InvalidArgument(
        fmt::format("{}: {} tokens cannot hold a window of {} + 1", source_, size(), t));
  }
  at::Tensor x = at::empty({count, t}, at::kLong), y = at::empty({count, t}, at::kLong);
  int64_t* xp = x.data_ptr<int64_t>();
  int64_t* yp = y.data_ptr<int64_t>();
  const uint64_t starts = static_cast<uint64_t>(size() - t);
  uint64_t state = seed;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t s = static_cast<int64_t>(splitmix64(state) % starts);
    std::copy_n(tokens_.begin() + s, t, xp + i * t);
    std::copy_n(tokens_.begin() + s + 1, t, yp + i * t);
  }
  return {x, y};
}

std::pair<at::Tensor, at::Tensor> TokenData::consecutive_windows(int64_t count, int64_t t) const {
  if (size() < count * t + 1) {
    throw InvalidArgument(
        fmt::format("{}: {} tokens cannot hold {} windows of {}", source_, size(), count, t));
  }
  at::Tensor all =
      at::from_blob(const_cast<int64_t*>(tokens_.data()), {count * t + 1}, at::kLong).clone();
  return {all.narrow(0, 0, count * t).view({count, t}),
          all.narrow(0, 1, count * t).view({count, t})};
}

std::vector<int64_t> TokenData::counts(int64_t vocab_size) const {
  if (max_token_ >= vocab_size) {
    throw InvalidArgument(fmt::format("{}: token id {} is past the vocabulary of {}", source_,
                                      max_token_, vocab_size));
  }
  std::vector<int64_t> counts(static_cast<size_t>(vocab_size), 0);
  for (int64_t id : tokens_) ++counts[static_cast<size_t>(id)];
  return counts;
}

}  // namespace curv
