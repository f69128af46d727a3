// curvtrain: trains a built-in model with any libcurv optimizer on Zipf-PCFG data, a token file or
// a model problem's own data, saves native checkpoints with optimizer state, and can probe its own
// updates every N steps into the ndsprobe HDF5 schema; see docs/cli.md. The work is
// curv::run_training; this file is its command line.
#include <cstdio>

#include "cli_common.h"
#include "curv/analysis/training_run.h"
#include "curv/core/runtime.h"

using namespace curv;

namespace {

const char* kTinyGpt =
    R"({"arch": "gpt", "vocab_size": 256, "block_size": 32, "n_layer": 2, "n_head": 2,
        "n_embd": 64, "bias": true, "tied": true})";

// --data and the Zipf-PCFG grammar, batch and set sizes.
struct DataArgs {
  TrainingDataOptions o;
  std::string data = "zipf";

  void add_to(CLI::App& app) {
    app.add_option("--batch-size", o.batch_size, "Sequences per step")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--eval-sequences", o.eval_sequences, "Validation sequences (balanced, s = 0)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--data", data,
                   "Training data: zipf (Zipf-PCFG) or a file of uint16 tokens (nanoGPT .bin)")
        ->capture_default_str();
    app.add_option("--zipf-s", o.zipf_s, "Zipf exponent s of the training data (0 = balanced)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--grammar-seed", o.grammar_seed, "Seed of the Zipf-PCFG grammar")
        ->capture_default_str();
    app.add_option("--zipf-depth", o.zipf_depth, "Levels of the grammar (preterminals included)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--zipf-symbols", o.zipf_symbols, "Nonterminals per level")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--zipf-rules", o.zipf_rules, "Production rules per nonterminal")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--zipf-emissions", o.zipf_emissions, "Tokens each preterminal can emit")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--train-tokens", o.train_tokens, "Tokens in the Zipf-PCFG training stream")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--probe-sequences", o.probe_sequences,
                   "Sequences in OUT/probe.safetensors, the balanced probe set written for "
                   "ndsprobe")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
  }
  TrainingDataOptions to_options(uint64_t seed) const {
    TrainingDataOptions options = o;
    options.token_file = data == "zipf" ? "" : data;
    options.seed = seed;
    return options;
  }
};

// --probe-every, --probe-output, --probe-on, --run-name.
struct InTrainingProbeArgs {
  int64_t every = 0;
  std::string output, on = "train", run_name;

  void add_to(CLI::App& app) {
    app.add_option("--probe-every", every,
                   "Probe the update every N steps into --probe-output (0 = off)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--probe-output", output, "HDF5 file of the in-training probe (appended to)");
    app.add_option("--probe-on", on,
                   "What the in-training probe audits each update on: train (its training batch, "
                   "direction update), probe (OUT/probe.safetensors, direction update.probe) or "
                   "both")
        ->capture_default_str()
        ->check(CLI::IsMember({"train", "probe", "both"}));
    app.add_option("--run-name", run_name,
                   "Run name in the probe output (default: the optimizer name)");
  }
  void to_options(TrainingRunOptions& options) const {
    options.probe_every = every;
    options.probe_output = output;
    options.probe_on = parse_probe_on(on);
    options.run_name = run_name;
  }
};

// --model, --optimizer, the schedule, --clip, --out, --save-every, --eval-every, --resume,
// --stop-at.
struct TrainArgs {
  std::string model;
  std::string optimizer = "adamw";
  int64_t steps = 200;
  int64_t warmup = 0;
  double min_lr_ratio = 0.1;
  double clip = 1.0;
  std::string out;
  int64_t save_every = 50;
  int64_t eval_every = 50;
  bool resume = false;
  int64_t stop_at = 0;

  void add_to(CLI::App& app) {
    app.add_option("--model", model,
                   "Built-in model config (.json); default: a 2-layer GPT, width 64, vocabulary "
                   "256, context 32");
    app.add_option("--optimizer", optimizer,
                   "Optimizer spec NAME[:key=value,...], e.g. adamw:lr=3e-3, "
                   "muon:lr=0.02,adam_lr=3e-3 (see docs/optimizers.md)")
        ->capture_default_str();
    app.add_option("--steps", steps, "Training steps")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--warmup", warmup, "Linear warm-up steps")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--min-lr-ratio", min_lr_ratio, "Cosine decay floor as a fraction of the lr")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--clip", clip, "Clip the gradient's global norm to this (0 = off)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("-o,--out", out,
                   "Checkpoint directory (step_<N>/ folders, log.csv, probe.safetensors)")
        ->required();
    app.add_option("--save-every", save_every,
                   "Save a checkpoint every N steps (and at 0 and the end)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--eval-every", eval_every, "Validation every N steps")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_flag("--resume", resume, "Continue from the last checkpoint in --out, exactly");
    app.add_option("--stop-at", stop_at,
                   "Stop after this step, saving a checkpoint (the schedule still spans --steps; "
                   "continue later with --resume); 0 = run to --steps")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
  }
  void to_options(TrainingRunOptions& options) const {
    options.model = model.empty() ? ModelConfig::from_json(kTinyGpt, "built-in tiny GPT")
                                  : ModelConfig::from_file(model);
    options.optimizer = OptimizerConfig::parse(optimizer);
    options.schedule = ScheduleOptions{steps, warmup, min_lr_ratio};
    options.clip = clip;
    options.out = out;
    options.save_every = save_every;
    options.eval_every = eval_every;
    options.resume = resume;
    options.stop_at = stop_at;
  }
};

// The library options curvtrain's flags set, for messages that name them (run_tool).
tools::FlagNames flag_names() {
  tools::FlagNames out = {
      {"TrainingRunOptions.model", "--model"},
      {"TrainingRunOptions.out", "--out"},
      {"TrainingRunOptions.save_every", "--save-every"},
      {"TrainingRunOptions.eval_every", "--eval-every"},
      {"TrainingRunOptions.clip", "--clip"},
      {"TrainingRunOptions.probe_every", "--probe-every"},
      {"TrainingRunOptions.probe_output", "--probe-output"},
      {"TrainingRunOptions.probe_on", "--probe-on"},
      {"TrainingDataOptions.token_file", "--data"},
  };
  out.insert(tools::RuntimeArgs::flags().begin(), tools::RuntimeArgs::flags().end());
  return out;
}

int run(int argc, char** argv) {
  TrainArgs train;
  DataArgs data;
  InTrainingProbeArgs probe;
  tools::RuntimeArgs runtime;
  CLI::App app{
      "curvtrain: train a built-in model with a libcurv optimizer on Zipf-PCFG data (or "
      "a token file), saving checkpoints that ndsprobe reads."};
  train.add_to(app);
  data.add_to(app);
  probe.add_to(app);
  runtime.sixteen_bit = false;
  runtime.add_to(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  runtime.init();
  TrainingRunOptions options;
  train.to_options(options);
  options.data = data.to_options(runtime.seed);
  probe.to_options(options);
  options.init = runtime.model_init();
  options.provenance = runtime.provenance("curvtrain", argc, argv);
  options.communicator = runtime.communicator();

  // Under torchrun every rank trains; rank 0 alone prints and writes.
  tools::Progress progress(runtime.quiet || !runtime.prints());
  const TrainingRunResult result = run_training(options, progress.callback());
  progress.finish();
  if (runtime.prints()) std::printf("curvtrain: %s\n", result.brief().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  reexec_for_blas_kernels(argv);
  return tools::run_tool("curvtrain", flag_names(), [&] { return run(argc, argv); });
}
