#include "curv/analysis/training_run.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "curv/analysis/in_training_probe.h"
#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/frequency_buckets.h"
#include "curv/core/probe_set.h"
#include "curv/io/checkpoint.h"
#include "curv/io/safetensors.h"
#include "curv/io/token_data.h"
#include "curv/io/zipf_pcfg.h"
#include "curv/models/model_problems.h"

namespace fs = std::filesystem;

namespace curv {

namespace {

uint64_t step_seed(uint64_t seed, int64_t step) {
  return seed * 7919ULL + static_cast<uint64_t>(step);
}

TrainingData language_data(const TrainingDataOptions& o, const ModelData& lm) {
  TrainingData d;
  const int64_t T = lm.context;
  auto train = std::make_shared<TokenData>();
  nlohmann::json meta;
  if (o.token_file.empty()) {
    ZipfPcfgOptions zo;
    zo.vocab_size = lm.vocab_size;
    zo.exponent = o.zipf_s;
    zo.grammar_seed = o.grammar_seed;
    zo.depth = o.zipf_depth;
    zo.symbols_per_level = o.zipf_symbols;
    zo.rules_per_symbol = o.zipf_rules;
    zo.emissions_per_symbol = o.zipf_emissions;
    ZipfPcfg grammar(zo);
    *train =
        TokenData(grammar.sample_tokens(o.train_tokens, o.zipf_s, o.grammar_seed + 1), "zipf-pcfg");
    auto [vx, vy] = grammar.sample_windows(o.eval_sequences, T, 0.0, o.grammar_seed + 2);
    d.validation = Batch{vx, vy};
    d.buckets = grammar.frequency_buckets(o.zipf_s);
    auto [px, py] = grammar.sample_windows(o.probe_sequences, T, 0.0, o.grammar_seed + 3);
    d.probe = Batch{px, py};
    d.probe_description = "balanced probe set (s = 0) from the training grammar";
    meta = {{"kind", "zipf-pcfg"},
            {"s", o.zipf_s},
            {"grammar", grammar.describe()},
            {"grammar_seed", o.grammar_seed},
            {"train_tokens", o.train_tokens}};
  } else {
    *train = TokenData::from_uint16_file(o.token_file);
    auto [vx, vy] = train->windows(o.eval_sequences, T, o.seed + 1000003ULL);
    d.validation = Batch{vx, vy};
    auto [px, py] = train->windows(o.probe_sequences, T, o.seed + 2000003ULL);
    d.probe = Batch{px, py};
    d.probe_description = "probe windows drawn from " + o.token_file;
    meta = {{"kind", "tokens"}, {"path", o.token_file}};
  }
  if (train->max_token() >= lm.vocab_size) {
    throw InvalidArgument(
        fmt::format("training data holds token id {} but the model's "
                    "vocabulary is {}",
                    train->max_token(), lm.vocab_size));
  }
  d.token_counts = train->counts(lm.vocab_size);
  d.batch = [train, T, batch_size = o.batch_size, seed = o.seed](int64_t step) {
    auto [x, y] = train->windows(batch_size, T, step_seed(seed, step));
    return Batch{x, y};
  };
  d.meta_json = meta.dump();
  return d;
}

// Keeps the rows of OUT/log.csv up to `step`: rows logged after the checkpoint a run resumes
// from are redone by it.
void truncate_log(const std::string& path, int64_t step) {
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    if (kept.empty() || std::stoll(line.substr(0, line.find(','))) <= step) kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

// OUT/token_counts.json: the training stream's token counts, the frequencies that define head and
// tail tokens for ndsprobe's --token-buckets (--token-counts), written atomically.
void write_token_counts(const std::string& path, const TrainingData& data) {
  const nlohmann::json j = {{"description", "token counts of the training stream"},
                            {"data", nlohmann::json::parse(data.meta_json)},
                            {"counts", data.token_counts}};
  write_text_atomically(path, j.dump() + "\n");
}

// FNV-1a over the parameters' bytes: equal digests mean bit-identical parameters.
uint64_t parameter_digest(const ParamVector& theta) {
  uint64_t h = 1469598103934665603ULL;
  for (const auto& t : theta) {
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ULL;
  }
  return h;
}

}  // namespace

TrainingData make_training_data(const TrainingDataOptions& o, const ModelConfig& config) {
  const ModelData model_data = config.data();
  if (model_data.kind == ModelData::Kind::kTokens) return language_data(o, model_data);
  if (!o.token_file.empty()) {
    throw InvalidOption(
        fmt::format("{{0}}: a {} model makes its own data; train it without {{1}}", config.arch()),
        {{"TrainingDataOptions.token_file", InvalidOption::literal(o.token_file)},
         {"TrainingDataOptions.token_file", ""}});
  }
  TrainingData d;
  if (model_data.kind == ModelData::Kind::kClasses) {
    // Classes drawn with frequencies p_c ∝ (c + 1)^(−s); validation and probe sets hold every
    // class once, so their loss is the class average and head and tail weigh alike.
    const int64_t classes = model_data.classes;
    d.batch = [classes, s = o.zipf_s, batch_size = o.batch_size, seed = o.seed](int64_t step) {
      return sample_memory_batch(classes, s, batch_size, step_seed(seed, step));
    };
    d.validation = memory_all_classes(classes);
    d.buckets = memory_class_buckets(classes, o.zipf_s);
    d.probe = memory_all_classes(classes);
    d.probe_description = "every class once (balanced)";
    d.meta_json =
        nlohmann::json{{"kind", "memory-classes"}, {"s", o.zipf_s}, {"classes", classes}}.dump();
    return d;
  }
  // The quadratic ignores its data: one placeholder example stands for every batch.
  Batch placeholder{at::zeros({1, 1}, at::kLong), at::zeros({1, 1}, at::kLong)};
  d.batch = [placeholder](int64_t) { return placeholder; };
  d.validation = placeholder;
  d.probe = placeholder;
  d.probe_description = "placeholder: the quadratic's loss does not depend on data";
  d.meta_json = nlohmann::json{{"kind", "none"}}.dump();
  return d;
}

Evaluation evaluate(Objective& model, const Batch& validation, const at::Tensor& buckets) {
  c10::NoGradGuard no_grad;
  Evaluation e;
  const Batch val{validation.inputs.to(model.device()), validation.targets.to(model.device())};
  at::Tensor losses = model.token_losses(val).to(at::kCPU, at::kDouble);
  e.loss = losses.mean().item<double>();
  if (buckets.defined()) {
    at::Tensor b =
        buckets.index({validation.targets.reshape(-1)}).reshape(validation.targets.sizes());
    auto mean_where = [&](int64_t id) {
      at::Tensor mask = b == id;
      return mask.any().item<bool>() ? losses.masked_select(mask).mean().item<double>()
                                     : std::nan("");
    };
    e.head = mean_where(kHeadBucket);
    e.tail = mean_where(kTailBucket);
  } else {
    e.head = e.tail = std::nan("");
  }
  return e;
}

void TrainingRunOptions::validate() const {
  if (model.data().kind == ModelData::Kind::kFeatures) {
    throw InvalidOption(fmt::format("training runs on tokens, classes or no data (gpt, quadratic, "
                                    "memory); {{0}} is a {} config, which reads features",
                                    model.arch()),
                        {{"TrainingRunOptions.model", ""}});
  }
  model.validate();
  optimizer.validate();
  schedule.validate();
  if (is_16_bit(init.dtype)) {
    // Training in 16 bits needs float32 master weights and state, which these runs do not keep;
    // their float32 checkpoints can be probed in 16 bits.
    throw InvalidOption(fmt::format("{{0}} {}: training runs are float32 or float64 (their "
                                    "checkpoints can be probed in 16 bits)",
                                    dtype_name(init.dtype)),
                        {{"ModelInit.dtype", ""}});
  }
  if (out.empty())
    throw InvalidOption("{0}: no checkpoint directory", {{"TrainingRunOptions.out", ""}});
  if (save_every < 1 || eval_every < 1) {
    throw InvalidOption("{0} and {1} must be >= 1",
                        {{"TrainingRunOptions.save_every", fmt::format("{}", save_every)},
                         {"TrainingRunOptions.eval_every", fmt::format("{}", eval_every)}});
  }
  if (!(clip >= 0))
    throw InvalidOption("{0} must be >= 0", {{"TrainingRunOptions.clip", fmt::format("{}", clip)}});
  if (probe_every > 0 && probe_output.empty()) {
    throw InvalidOption("{0} needs {1} (an HDF5 file)",
                        {{"TrainingRunOptions.probe_every", std::to_string(probe_every)},
                         {"TrainingRunOptions.probe_output", ""}});
  }
}

ProbeOn parse_probe_on(const std::string& text) {
  if (text == "train") return ProbeOn::kTrain;
  if (text == "probe") return ProbeOn::kProbe;
  if (text == "both") return ProbeOn::kBoth;
  throw InvalidOption(
      fmt::format("{{0}} = '{}': expected train, probe or both", InvalidOption::literal(text)),
      {{"TrainingRunOptions.probe_on", ""}});
}

std::string to_string(ProbeOn on) {
  switch (on) {
    case ProbeOn::kTrain:
      return "train";
    case ProbeOn::kProbe:
      return "probe";
    case ProbeOn::kBoth:
      return "both";
  }
  return "?";
}

std::string TrainingRunResult::brief() const {
  return fmt::format(
      "{}, step {} of {}: train loss {:.4f}, validation loss {:.4f} (head {:.4f}, tail {:.4f})",
      optimizer, step, total_steps, train_loss, validation.loss, validation.head, validation.tail);
}

namespace {

// The in-training probe and the report it writes (both null unless o.probe_every > 0).
struct TrainingProbe {
  std::unique_ptr<ProbeReport> report;
  std::unique_ptr<InTrainingProbe> probe;
};

TrainingProbe make_training_probe(const TrainingRunOptions& o, const Objective& model,
                                  const Optimizer& optimizer, const TrainingData& data,
                                  Communicator& comm) {
  TrainingProbe out;
  if (o.probe_every <= 0) return out;
  const int world = comm.world_size();
  Provenance p = o.provenance;
  p.model = model.describe();
  p.seed = 0;
  const std::optional<ProbeSet> fixed_probe = o.probe_on == ProbeOn::kTrain
                                                  ? std::nullopt
                                                  : std::optional<ProbeSet>(ProbeSet({data.probe}));
  // The file's identity: which data the audits ran on.
  p.probe_hash = o.probe_on == ProbeOn::kTrain   ? "training-batch"
                 : o.probe_on == ProbeOn::kProbe ? fixed_probe->hash()
                                                 : "training-batch+" + fixed_probe->hash();
  p.blocks = "layer";
  p.hvp_method = HvpMethod::kExact;
  p.world_size = world;
  p.distributed_backend = comm.backend();
  out.report = std::make_unique<ProbeReport>(o.probe_output, p, /*resume=*/true,
                                             o.communicator ? o.communicator : single_process());
  const std::string run = o.run_name.empty() ? o.optimizer.name : o.run_name;
  out.report->set_run_attribute(run, "optimizer", optimizer.meta_json());
  out.report->set_run_attribute(run, "data", data.meta_json);
  InTrainingProbeOptions po;
  po.every = o.probe_every;
  po.on_training_batch = o.probe_on != ProbeOn::kProbe;
  po.communicator = o.communicator;
  out.probe = std::make_unique<InTrainingProbe>(
      *out.report, run,
      BlockPartition::by_rule(model.space(), model.structure(), BlockRule::kLayer), po,
      fixed_probe);
  return out;
}

// Loads the last checkpoint of `out` into the model and the optimizer; returns its step.
int64_t resume_from_last_checkpoint(const std::string& out, Objective& model,
                                    Optimizer& optimizer) {
  auto listing = list_checkpoints(out, {}, CheckpointLayout::kNative);  // its own saves
  Checkpoint last = load_checkpoint(listing.back());
  load_parameters(model, parameters_from(last, model.space(), model.parameters()));
  optimizer.load_state(last.optimizer, last.step_count().value_or(last.step),
                       last.path + "/optimizer.safetensors");
  std::fprintf(stderr, "curvtrain: resuming from %s\n", last.path.c_str());
  return last.step;
}

// The other ranks hold the same parameters: rank 0 evaluates for all (NaN elsewhere).
Evaluation root_evaluation(Communicator& comm, Objective& model, const TrainingData& data) {
  Evaluation e;
  if (comm.is_root()) return evaluate(model, data.validation, data.buckets);
  e.loss = e.head = e.tail = std::nan("");
  return e;
}

}  // namespace

TrainingRunResult run_training(const TrainingRunOptions& o, const ProgressCallback& progress) {
  o.validate();
  at::manual_seed(o.init.seed);
  auto model = make_model(o.model, o.init);
  auto optimizer = make_optimizer(o.optimizer, model->space(), model->structure());
  const double base_lr = o.optimizer.lr, base_adam_lr = o.optimizer.adam_lr;
  const ScheduleOptions& schedule = o.schedule;
  const int64_t steps = schedule.total_steps;

  TrainingData data = make_training_data(o.data, o.model);
  // Every rank computes; rank 0 alone writes the checkpoint directory.
  Communicator& comm = o.communicator ? *o.communicator : *single_process();
  const int world = comm.world_size();
  on_root(comm, [&] {
    fs::create_directories(o.out);
    write_safetensors(o.out + "/probe.safetensors",
                      {{"inputs", data.probe.inputs}, {"targets", data.probe.targets}},
                      {{"description", data.probe_description}});
    if (!data.token_counts.empty()) write_token_counts(o.out + "/token_counts.json", data);
  });

  const int64_t start = o.resume ? resume_from_last_checkpoint(o.out, *model, *optimizer) : 0;

  const nlohmann::json data_meta = nlohmann::json::parse(data.meta_json);
  auto meta_for = [&](int64_t step) {
    // The lr recorded is the one update step+1 uses, so a direction rebuilt from this
    // checkpoint is the step actually taken from it.
    const double mult = lr_multiplier(schedule, step + 1);
    optimizer->mutable_config().lr = base_lr * mult;
    optimizer->mutable_config().adam_lr = base_adam_lr * mult;
    nlohmann::json meta;
    meta["model"] = nlohmann::json::parse(o.model.to_json());
    meta["optimizer"] = nlohmann::json::parse(optimizer->meta_json());
    meta["data"] = data_meta;
    meta["train"] = {{"seed", o.data.seed},
                     {"batch_size", o.data.batch_size},
                     {"steps", steps},
                     {"warmup", schedule.warmup_steps},
                     {"min_lr_ratio", schedule.min_lr_ratio},
                     {"clip", o.clip},
                     {"base_lr", base_lr},
                     {"dtype", dtype_name(o.init.dtype)}};
    return meta.dump();
  };
  auto save = [&](int64_t step) {
    const ParamVector theta = snapshot_parameters(*model);
    // The ranks took the same steps from the same reduced gradients: a rank whose parameters
    // differ (another build or thread count) stops the run rather than train something else.
    check_same_on_all_ranks(comm, parameter_digest(theta),
                            fmt::format("parameters at step {}", step));
    on_root(comm, [&] {
      save_checkpoint(o.out, step, model->space(), theta, optimizer->state(), meta_for(step));
    });
  };

  const TrainingProbe training_probe = make_training_probe(o, *model, *optimizer, data, comm);
  InTrainingProbe* probe = training_probe.probe.get();

  const std::string log_path = o.out + "/log.csv";
  std::ofstream log;
  on_root(comm, [&] {
    if (o.resume && fs::exists(log_path)) truncate_log(log_path, start);
    log.open(log_path, o.resume ? std::ios::app : std::ios::trunc);
    if (!log) throw InvalidArgument(fmt::format("cannot write '{}'", log_path));
    if (!o.resume) log << "step,lr,train_loss,val_loss,val_head_loss,val_tail_loss\n";
  });
  if (!o.resume) save(0);

  const int64_t stop = o.stop_at > 0 ? std::min(o.stop_at, steps) : steps;
  const auto total = static_cast<size_t>(steps - start);
  double running = std::nan("");
  EngineOptions plain;
  plain.reuse_graph = false;  // training needs gradients only
  plain.communicator = o.communicator;
  for (int64_t t = start; t < stop; ++t) {
    const double mult = lr_multiplier(schedule, t + 1);
    optimizer->mutable_config().lr = base_lr * mult;
    optimizer->mutable_config().adam_lr = base_adam_lr * mult;
    Batch batch = data.batch(t);
    ParamVector theta = snapshot_parameters(*model);
    ParamVector grad;
    double loss;
    {
      // One shard of the batch per rank; the engine sums the shards' gradients over the ranks.
      CurvatureEngine engine(*model, ProbeSet::shards(batch, world), plain);
      loss = engine.loss();
      grad = clone(engine.gradient());
    }
    if (o.clip > 0) {
      const double g = norm(grad);
      if (g > o.clip) grad = scaled(grad, o.clip / g);
    }
    ParamVector u = optimizer->step(theta, grad);
    if (probe && probe->due(t)) {
      probe->measure(*model, t, theta, u, batch);
    } else {
      load_parameters(*model, add(theta, u));
    }
    running = std::isnan(running) ? loss : 0.9 * running + 0.1 * loss;
    const int64_t done = t + 1;
    if ((done % o.eval_every == 0 || done == steps) && comm.is_root()) {
      Evaluation e = evaluate(*model, data.validation, data.buckets);
      log << fmt::format("{},{:.6g},{:.6f},{:.6f},{:.6f},{:.6f}\n", done, base_lr * mult, running,
                         e.loss, e.head, e.tail);
      log.flush();
      if (progress) {
        progress(static_cast<size_t>(done - start), total,
                 fmt::format("step {} train {:.4f} val {:.4f}", done, running, e.loss));
      }
    }
    if (done % o.save_every == 0 || done == steps || done == stop) save(done);
  }
  TrainingRunResult result;
  result.optimizer = o.optimizer.name;
  result.step = stop;
  result.total_steps = steps;
  result.train_loss = running;
  result.validation = root_evaluation(comm, *model, data);
  return result;
}

}  // namespace curv
