// A stream of token ids (a Zipf-PCFG sample or a nanoGPT-style uint16 file) and the language-model
// windows cut from it: inputs = tokens[i, i+T), targets = tokens[i+1, i+T+1).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace curv {

class TokenData {
 public:
  TokenData() = default;
  TokenData(std::vector<int64_t> tokens, std::string source);
  // Raw little-endian uint16 tokens (nanoGPT's train.bin / val.bin). FormatError names the file.
  static TokenData from_uint16_file(const std::string& path);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t max_token() const { return max_token_; }
  const std::string& source() const { return source_; }
  // `count` windows of length `t` at offsets drawn from a seeded generator: (inputs, targets),
  // int64 (count, t). The same seed gives the same windows on every platform.
  std::pair<at::Tensor, at::Tensor> windows(int64_t count, int64_t t, uint64_t seed) const;
  // Consecutive non-overlapping windows from the start, as a probe set usually wants.
  std::pair<at::Tensor, at::Tensor> consecutive_windows(int64_t count, int64_t t) const;
  // Occurrences of each token id in the stream, indexed by id, `vocab_size` entries (ids past
  // it are an InvalidArgument).
  std::vector<int64_t> counts(int64_t vocab_size) const;

 private:
  std::vector<int64_t> tokens_;
  std::string source_;
  int64_t max_token_ = -1;
};

}  // namespace curv
