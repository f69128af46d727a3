// curvtrain: trains a built-in GPT with any libcurv optimizer on Zipf-PCFG data or
// a token file, saves native checkpoints with optimizer state, and can probe its own updates
// every N steps into the ndsprobe HDF5 schema; see docs/cli.md.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "curv/io/checkpoint.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/models/model_problems.h"
#include "curv/models/models.h"
#include "curv/optim/optimizers.h"
#include "curv/core/probe_set.h"
#include "curv/analysis/report.h"
#include "curv/core/runtime.h"
#include "curv/io/safetensors.h"
#include "curv/io/token_data.h"
#include "curv/analysis/in_training_probe.h"
#include "curv/optim/schedule.h"
#include "curv/io/zipf_pcfg.h"

namespace fs = std::filesystem;
using namespace curv;

namespace {

struct Args {
  std::string model_config;
  tools::RuntimeArgs runtime;
  std::string optimizer = "adamw";
  int64_t steps = 200;
  int64_t batch_size = 16;
  int64_t warmup = 0;
  double min_lr_ratio = 0.1;
  double clip = 1.0;
  std::string out;
  int64_t save_every = 50;
  int64_t eval_every = 50;
  int64_t eval_sequences = 64;
  std::string data = "zipf";
  double zipf_s = 1.0;
  uint64_t grammar_seed = 0;
  // A grammar small enough that a tiny GPT learns its structure in a few hundred steps.
  int64_t zipf_depth = 4, zipf_symbols = 8, zipf_rules = 4, zipf_emissions = 4;
  int64_t train_tokens = 1 << 20;
  int64_t probe_sequences = 64;
  int64_t probe_every = 0;
  std::string probe_output;
  std::string probe_on = "train";
  std::string run_name;
  bool resume = false;
  int64_t stop_at = 0;
};

const char* kTinyGpt =
    R"({"arch": "gpt", "vocab_size": 256, "block_size": 32, "n_layer": 2, "n_head": 2,
        "n_embd": 64, "bias": true, "tied": true})";

// What a model trains on: the batch of each step, a validation set with its head/tail buckets,
// and the probe set written for ndsprobe. Batches depend on (seed, step) only, so a resumed run
// sees exactly the batches an uninterrupted one would.
struct TrainingData {
  std::function<Batch(int64_t step)> batch;
  Batch val;
  at::Tensor buckets;  // bucket id per target id (ZipfPcfg's ids); undefined: no head/tail split
  Batch probe;
  std::string probe_description;
  nlohmann::json meta;
};

uint64_t step_seed(uint64_t seed, int64_t step) { return seed * 7919ULL + static_cast<uint64_t>(step); }

TrainingData language_data(const Args& a, const ModelData& lm) {
  TrainingData d;
  const int64_t T = lm.context;
  auto train = std::make_shared<TokenData>();
  if (a.data == "zipf") {
    ZipfPcfgOptions zo;
    zo.vocab_size = lm.vocab_size;
    zo.exponent = a.zipf_s;
    zo.grammar_seed = a.grammar_seed;
    zo.depth = a.zipf_depth;
    zo.symbols_per_level = a.zipf_symbols;
    zo.rules_per_symbol = a.zipf_rules;
    zo.emissions_per_symbol = a.zipf_emissions;
    ZipfPcfg grammar(zo);
    *train = TokenData(grammar.sample_tokens(a.train_tokens, a.zipf_s, a.grammar_seed + 1), "zipf-pcfg");
    auto [vx, vy] = grammar.sample_windows(a.eval_sequences, T, 0.0, a.grammar_seed + 2);
    d.val = Batch{vx, vy};
    d.buckets = grammar.frequency_buckets(a.zipf_s);
    auto [px, py] = grammar.sample_windows(a.probe_sequences, T, 0.0, a.grammar_seed + 3);
    d.probe = Batch{px, py};
    d.probe_description = "balanced probe set (s = 0) from the training grammar";
    d.meta = {{"kind", "zipf-pcfg"}, {"s", a.zipf_s}, {"grammar", grammar.describe()},
              {"grammar_seed", a.grammar_seed}, {"train_tokens", a.train_tokens}};
  } else {
    *train = TokenData::from_uint16_file(a.data);
    auto [vx, vy] = train->windows(a.eval_sequences, T, a.runtime.seed + 1000003ULL);
    d.val = Batch{vx, vy};
    auto [px, py] = train->windows(a.probe_sequences, T, a.runtime.seed + 2000003ULL);
    d.probe = Batch{px, py};
    d.probe_description = "probe windows drawn from " + a.data;
    d.meta = {{"kind", "tokens"}, {"path", a.data}};
  }
  if (train->max_token() >= lm.vocab_size) {
    throw InvalidArgument(fmt::format("training data holds token id {} but the model's vocabulary "
                                      "is {}", train->max_token(), lm.vocab_size));
  }
  d.batch = [train, T, batch_size = a.batch_size, seed = a.runtime.seed](int64_t step) {
    auto [x, y] = train->windows(batch_size, T, step_seed(seed, step));
    return Batch{x, y};
  };
  return d;
}

TrainingData make_training_data(const Args& a, const ModelConfig& config) {
  const ModelData model_data = config.data();
  if (model_data.kind == ModelData::Kind::kTokens) return language_data(a, model_data);
  if (a.data != "zipf") {
    throw InvalidArgument(fmt::format("--data {}: a {} model makes its own data (leave --data at zipf)",
                                      a.data, config.arch()));
  }
  TrainingData d;
  if (model_data.kind == ModelData::Kind::kClasses) {
    // Classes drawn with frequencies p_c ∝ (c + 1)^(−s); validation and probe sets hold every
    // class once, so their loss is the class average and head and tail weigh alike.
    const int64_t classes = model_data.classes;
    d.batch = [classes, s = a.zipf_s, batch_size = a.batch_size, seed = a.runtime.seed](int64_t step) {
      return sample_memory_batch(classes, s, batch_size, step_seed(seed, step));
    };
    d.val = memory_all_classes(classes);
    d.buckets = memory_class_buckets(classes, a.zipf_s);
    d.probe = memory_all_classes(classes);
    d.probe_description = "every class once (balanced)";
    d.meta = {{"kind", "memory-classes"}, {"s", a.zipf_s}, {"classes", classes}};
    return d;
  }
  // The quadratic ignores its data: one placeholder example stands for every batch.
  Batch placeholder{at::zeros({1, 1}, at::kLong), at::zeros({1, 1}, at::kLong)};
  d.batch = [placeholder](int64_t) { return placeholder; };
  d.val = placeholder;
  d.probe = placeholder;
  d.probe_description = "placeholder: the quadratic's loss does not depend on data";
  d.meta = {{"kind", "none"}};
  return d;
}

struct Eval {
  double loss = 0, head = 0, tail = 0;
};

Eval evaluate(Objective& model, const Batch& val_cpu, const at::Tensor& buckets) {
  at::NoGradGuard no_grad;
  Eval e;
  const Batch val{val_cpu.inputs.to(model.device()), val_cpu.targets.to(model.device())};
  at::Tensor losses = model.token_losses(val).to(at::kCPU, at::kDouble);
  e.loss = losses.mean().item<double>();
  if (buckets.defined()) {
    at::Tensor b = buckets.index({val_cpu.targets.reshape(-1)}).reshape(val_cpu.targets.sizes());
    auto mean_where = [&](int64_t id) {
      at::Tensor mask = b == id;
      return mask.any().item<bool>() ? losses.masked_select(mask).mean().item<double>() : std::nan("");
    };
    e.head = mean_where(ZipfPcfg::kHeadBucket);
    e.tail = mean_where(ZipfPcfg::kTailBucket);
  } else {
    e.head = e.tail = std::nan("");
  }
  return e;
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app{"curvtrain: train a built-in model with a libcurv optimizer on Zipf-PCFG data (or a "
               "token file), saving checkpoints that ndsprobe reads."};
  app.add_option("--model", a.model_config, "Built-in model config (.json); default: a 2-layer GPT, "
                 "width 64, vocabulary 256, context 32");
  app.add_option("--optimizer", a.optimizer, "Optimizer spec NAME[:key=value,...], e.g. adamw:lr=3e-3, "
                 "muon:lr=0.02,adam_lr=3e-3 (see docs/optimizers.md)")->capture_default_str();
  app.add_option("--steps", a.steps, "Training steps")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch-size", a.batch_size, "Sequences per step")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "Linear warm-up steps")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--min-lr-ratio", a.min_lr_ratio, "Cosine decay floor as a fraction of the lr")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--clip", a.clip, "Clip the gradient's global norm to this (0 = off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("-o,--out", a.out, "Checkpoint directory (step_<N>/ folders, log.csv, probe.safetensors)")->required();
  app.add_option("--save-every", a.save_every, "Save a checkpoint every N steps (and at 0 and the end)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--eval-every", a.eval_every, "Validation every N steps")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--eval-sequences", a.eval_sequences, "Validation sequences (balanced, s = 0)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--data", a.data, "Training data: zipf (Zipf-PCFG) or a file of uint16 tokens (nanoGPT .bin)")
      ->capture_default_str();
  app.add_option("--zipf-s", a.zipf_s, "Zipf exponent s of the training data (0 = balanced)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--grammar-seed", a.grammar_seed, "Seed of the Zipf-PCFG grammar")->capture_default_str();
  app.add_option("--zipf-depth", a.zipf_depth, "Levels of the grammar (preterminals included)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--zipf-symbols", a.zipf_symbols, "Nonterminals per level")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--zipf-rules", a.zipf_rules, "Production rules per nonterminal")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--zipf-emissions", a.zipf_emissions, "Tokens each preterminal can emit")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--train-tokens", a.train_tokens, "Tokens in the Zipf-PCFG training stream")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--probe-sequences", a.probe_sequences,
                 "Sequences in OUT/probe.safetensors, the balanced probe set written for ndsprobe")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--probe-every", a.probe_every, "Probe the update every N steps into --probe-output (0 = off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--probe-output", a.probe_output, "HDF5 file of the in-training probe (appended to)");
  app.add_option("--probe-on", a.probe_on, "What the in-training probe audits each update on: train "
                 "(its training batch, direction update), probe (OUT/probe.safetensors, direction "
                 "update.probe) or both")
      ->capture_default_str()->check(CLI::IsMember({"train", "probe", "both"}));
  app.add_option("--run-name", a.run_name, "Run name in the probe output (default: the optimizer name)");
  app.add_flag("--resume", a.resume, "Continue from the last checkpoint in --out, exactly");
  app.add_option("--stop-at", a.stop_at, "Stop after this step, saving a checkpoint (the schedule "
                 "still spans --steps; continue later with --resume); 0 = run to --steps")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  tools::add_runtime_args(app, a.runtime);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  init_runtime(RuntimeOptions{a.runtime.threads});
  at::manual_seed(a.runtime.seed);

  ModelConfig config = a.model_config.empty() ? ModelConfig::from_json(kTinyGpt, "built-in tiny GPT")
                                              : ModelConfig::from_file(a.model_config);
  if (config.data().kind == ModelData::Kind::kFeatures) {
    throw InvalidArgument(fmt::format("curvtrain trains models on tokens, classes or no data (gpt, "
                                      "quadratic, memory); --model is a {} config, which reads "
                                      "features", config.arch()));
  }
  const auto dtype = tools::parse_dtype(a.runtime.dtype);
  auto model = make_model(config, ModelInit{a.runtime.seed, dtype, a.runtime.device});
  OptimizerConfig opt_config = OptimizerConfig::parse(a.optimizer);
  auto optimizer = make_optimizer(opt_config, model->space());
  const double base_lr = opt_config.lr, base_adam_lr = opt_config.adam_lr;
  ScheduleOptions schedule{a.steps, a.warmup, a.min_lr_ratio};
  schedule.validate();

  TrainingData data = make_training_data(a, config);
  fs::create_directories(a.out);
  write_safetensors(a.out + "/probe.safetensors",
                    {{"inputs", data.probe.inputs}, {"targets", data.probe.targets}},
                    {{"description", data.probe_description}});
  const nlohmann::json& data_meta = data.meta;

  int64_t start = 0;
  if (a.resume) {
    auto listing = list_checkpoints(a.out, {}, CheckpointLayout::kNative);  // its own saves
    Checkpoint last = load_checkpoint(listing.back());
    load_parameters(*model, parameters_from(last, model->space(), model->parameters()));
    optimizer->load_state(last.optimizer, last.step_count().value_or(last.step),
                          last.path + "/optimizer.safetensors");
    start = last.step;
    std::fprintf(stderr, "curvtrain: resuming from %s\n", last.path.c_str());
  }

  auto meta_for = [&](int64_t step) {
    // The lr recorded is the one update step+1 uses, so a direction rebuilt from this
    // checkpoint is the step actually taken from it.
    const double mult = lr_multiplier(schedule, step + 1);
    optimizer->mutable_config().lr = base_lr * mult;
    optimizer->mutable_config().adam_lr = base_adam_lr * mult;
    nlohmann::json meta;
    meta["model"] = nlohmann::json::parse(config.to_json());
    meta["optimizer"] = nlohmann::json::parse(optimizer->meta_json());
    meta["data"] = data_meta;
    meta["train"] = {{"seed", a.runtime.seed}, {"batch_size", a.batch_size}, {"steps", a.steps},
                     {"warmup", a.warmup}, {"min_lr_ratio", a.min_lr_ratio}, {"clip", a.clip},
                     {"base_lr", base_lr}, {"dtype", a.runtime.dtype}};
    return meta.dump();
  };
  auto save = [&](int64_t step) {
    save_checkpoint(a.out, step, model->space(), snapshot_parameters(*model), optimizer->state(),
                    meta_for(step));
  };

  std::unique_ptr<ProbeReport> report;
  std::unique_ptr<InTrainingProbe> probe;
  if (a.probe_every > 0) {
    if (a.probe_output.empty()) throw InvalidArgument("--probe-every needs --probe-output FILE.h5");
    Provenance p;
    p.tool = "curvtrain";
    p.version = CURV_VERSION;
    p.command_line = tools::command_line(argc, argv);
    p.model = model->describe();
    p.dtype = a.runtime.dtype;
    p.seed = 0;
    const std::optional<ProbeSet> fixed_probe =
        a.probe_on == "train" ? std::nullopt : std::optional<ProbeSet>(ProbeSet({data.probe}));
    // The file's identity: which data the audits ran on.
    p.probe_hash = a.probe_on == "train" ? "training-batch"
                   : a.probe_on == "probe" ? fixed_probe->hash()
                                           : "training-batch+" + fixed_probe->hash();
    p.threads = a.runtime.threads == 0 ? hardware_threads() : a.runtime.threads;
    p.runtime = runtime_summary();
    p.blocks = "layer";
    p.hvp_method = "exact";
    report = std::make_unique<ProbeReport>(a.probe_output, p, /*resume=*/true);
    const std::string run = a.run_name.empty() ? opt_config.name : a.run_name;
    report->set_run_attribute(run, "optimizer", optimizer->meta_json());
    report->set_run_attribute(run, "data", data_meta.dump());
    InTrainingProbeOptions po;
    po.every = a.probe_every;
    po.on_training_batch = a.probe_on != "probe";
    probe = std::make_unique<InTrainingProbe>(
        *report, run, BlockPartition::by_rule(model->space(), BlockRule::kLayer), po, fixed_probe);
  }

  const std::string log_path = a.out + "/log.csv";
  if (a.resume && fs::exists(log_path)) {
    // Rows logged after the checkpoint we resume from are redone by this run.
    std::ifstream in(log_path);
    std::string line, kept;
    while (std::getline(in, line)) {
      if (kept.empty() || std::stoll(line.substr(0, line.find(','))) <= start) kept += line + "\n";
    }
    in.close();
    std::ofstream(log_path, std::ios::trunc) << kept;
  }
  std::ofstream log(log_path, a.resume ? std::ios::app : std::ios::trunc);
  if (!log) throw InvalidArgument(fmt::format("cannot write '{}'", log_path));
  if (!a.resume) log << "step,lr,train_loss,val_loss,val_head_loss,val_tail_loss\n";
  if (!a.resume) save(0);

  tools::Progress progress(static_cast<size_t>(a.steps - start), a.runtime.quiet);
  double running = std::nan("");
  EngineOptions plain;
  plain.reuse_graph = false;  // training needs gradients only
  const int64_t stop = a.stop_at > 0 ? std::min(a.stop_at, a.steps) : a.steps;
  for (int64_t t = start; t < stop; ++t) {
    const double mult = lr_multiplier(schedule, t + 1);
    optimizer->mutable_config().lr = base_lr * mult;
    optimizer->mutable_config().adam_lr = base_adam_lr * mult;
    Batch batch = data.batch(t);
    ParamVector theta = snapshot_parameters(*model);
    ParamVector grad;
    double loss;
    {
      CurvatureEngine engine(*model, ProbeSet({batch}), plain);
      loss = engine.loss();
      grad = clone(engine.gradient());
    }
    if (a.clip > 0) {
      const double g = norm(grad);
      if (g > a.clip) grad = scaled(grad, a.clip / g);
    }
    ParamVector u = optimizer->step(theta, grad);
    if (probe && probe->due(t)) {
      probe->measure(*model, t, theta, u, batch);
    } else {
      load_parameters(*model, add(theta, u));
    }
    running = std::isnan(running) ? loss : 0.9 * running + 0.1 * loss;
    const int64_t done = t + 1;
    if (done % a.eval_every == 0 || done == a.steps) {
      Eval e = evaluate(*model, data.val, data.buckets);
      log << fmt::format("{},{:.6g},{:.6f},{:.6f},{:.6f},{:.6f}\n", done, base_lr * mult, running,
                         e.loss, e.head, e.tail);
      log.flush();
      progress.update(static_cast<size_t>(done - start),
                      fmt::format("step {} train {:.4f} val {:.4f}", done, running, e.loss));
    }
    if (done % a.save_every == 0 || done == a.steps || done == stop) save(done);
  }
  progress.finish();
  Eval final_eval = evaluate(*model, data.val, data.buckets);
  std::printf("curvtrain: %s, step %lld of %lld: train loss %.4f, validation loss %.4f (head %.4f, tail %.4f)\n",
              opt_config.name.c_str(), static_cast<long long>(stop), static_cast<long long>(a.steps),
              running, final_eval.loss,
              final_eval.head, final_eval.tail);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tools::run_tool("curvtrain", [&] { return run(argc, argv); });
}
