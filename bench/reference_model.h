// The reference GPT and probe batch of docs/performance.md, shared by the benchmark programs so
// that their numbers describe the same model.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "curv/core/probe_set.h"
#include "curv/models/models.h"

namespace curv_bench {

inline curv::ModelConfig reference_config() {
  return curv::ModelConfig::from_json(R"({"arch": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 128,
                                          "vocab_size": 512, "block_size": 64, "tied": true})");
}

// One batch of `sequences` random sequences of the model's context length (inputs and
// next-token targets) for a token model of any architecture.
inline curv::ProbeSet reference_probe(const curv::ModelConfig& config, at::Generator& gen,
                                      int64_t sequences = 32) {
  const curv::ModelData data = config.data();
  auto tokens = at::randint(0, data.vocab_size, {sequences, data.context + 1}, gen,
                            at::TensorOptions().dtype(at::kLong));
  const int64_t t = data.context;
  return curv::ProbeSet(
      {curv::Batch{tokens.narrow(1, 0, t).contiguous(), tokens.narrow(1, 1, t).contiguous()}});
}

}  // namespace curv_bench
