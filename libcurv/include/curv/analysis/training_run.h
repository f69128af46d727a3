// curvtrain as a library call: trains a built-in model with a libcurv optimizer on Zipf-PCFG
// data, a uint16 token file, or a model problem's own data; saves native checkpoints with
// optimizer state every N steps, logs validation loss with its head/tail split, resumes exactly,
// and can audit its own updates into the ndsprobe HDF5 schema as it goes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "curv/analysis/report.h"
#include "curv/core/distributed.h"
#include "curv/core/objective.h"
#include "curv/core/progress.h"
#include "curv/models/models.h"
#include "curv/optim/optimizers.h"
#include "curv/optim/schedule.h"

namespace curv {

// What the in-training probe audits each update on.
enum class ProbeOn {
  kTrain,  // the update's own training batch (direction "update")
  kProbe,  // the written probe set (direction "update.probe")
  kBoth,
};
// "train" | "probe" | "both"; InvalidOption naming TrainingRunOptions.probe_on otherwise.
ProbeOn parse_probe_on(const std::string& text);
std::string to_string(ProbeOn on);

struct TrainingDataOptions {
  // A file of uint16 tokens (nanoGPT's .bin) to train on; empty: the Zipf-PCFG stream below.
  std::string token_file;
  double zipf_s = 1.0;  // Zipf exponent of the training data (0 = balanced)
  uint64_t grammar_seed = 0;
  // A grammar small enough that a tiny GPT learns its structure in a few hundred steps.
  int64_t zipf_depth = 4;
  int64_t zipf_symbols = 8;
  int64_t zipf_rules = 4;
  int64_t zipf_emissions = 4;
  int64_t train_tokens = 1 << 20;  // tokens in the Zipf-PCFG training stream
  int64_t batch_size = 16;         // examples per step
  int64_t eval_sequences = 64;     // validation examples (balanced, s = 0)
  int64_t probe_sequences = 64;    // examples of the probe set written for ndsprobe
  uint64_t seed = 0;               // batch order; token-file windows
};

// What a model trains on. Batches depend on (seed, step) only, so a resumed run sees exactly the
// batches an uninterrupted one would.
struct TrainingData {
  std::function<Batch(int64_t step)> batch;
  Batch validation;
  at::Tensor buckets;  // head/tail bucket per target id; undefined: no split
  Batch probe;
  std::string probe_description;
  std::string meta_json;  // meta.json's "data" object
  // Occurrences of each token id in the training stream (language models; empty otherwise):
  // curvtrain writes them to OUT/token_counts.json for ndsprobe's --token-counts.
  std::vector<int64_t> token_counts;
};

// The data of `config`'s architecture: language-model windows for gpt, class draws for the
// associative memory, a placeholder for the quadratic. InvalidArgument naming the option when
// the data cannot serve the model (a token file for a model problem, token ids past the
// vocabulary).
TrainingData make_training_data(const TrainingDataOptions& options, const ModelConfig& config);

struct Evaluation {
  double loss = 0, head = 0, tail = 0;  // head/tail NaN without buckets
};
Evaluation evaluate(Objective& model, const Batch& validation, const at::Tensor& buckets);

struct TrainingRunOptions {
  ModelConfig model;  // a built-in architecture other than mlp
  ModelInit init;
  OptimizerConfig optimizer;
  ScheduleOptions schedule;  // schedule.total_steps is the run's length
  double clip = 1.0;         // global gradient-norm clip (0 = off)
  std::string out;           // checkpoint directory
  int64_t save_every = 50;   // also at 0, at the end and at stop_at
  int64_t eval_every = 50;
  TrainingDataOptions data;
  // In-training probe: audit update t when t % probe_every == 0 (0 = off) into probe_output, on
  // the training batch ("train"), the written probe set ("probe") or both.
  int64_t probe_every = 0;
  std::string probe_output;
  ProbeOn probe_on = ProbeOn::kTrain;
  std::string run_name;   // in the probe output; default: the optimizer's name
  bool resume = false;    // continue from the last checkpoint in `out`, exactly
  int64_t stop_at = 0;    // stop after this step (the schedule still spans total_steps); 0 = end
  Provenance provenance;  // of the probe output: tool, command line, dtype, threads
  // Data parallelism (curv/core/distributed.h): each step's batch is split into one shard per
  // rank, the gradient summed over the ranks, and every rank takes the same step; rank 0 alone
  // writes checkpoints, the log and the probe output. Null: one process.
  std::shared_ptr<Communicator> communicator;

  void validate() const;  // InvalidArgument naming the field and value
};

struct TrainingRunResult {
  std::string optimizer;
  int64_t step = 0;  // the step it stopped at
  int64_t total_steps = 0;
  double train_loss = 0;      // running mean (EMA 0.9) of the training loss
  Evaluation validation;      // at `step`
  std::string brief() const;  // "adamw, step 200 of 200: train loss …, validation loss … (…)"
};

// Progress counts the updates this call takes; the label carries training and validation loss.
TrainingRunResult run_training(const TrainingRunOptions& options,
                               const ProgressCallback& progress = {});

}  // namespace curv
