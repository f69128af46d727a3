// Checkpoints as tensor sources, and runs saved by torch.distributed.checkpoint itself: a tiny
// LLaMA trained under FSDP2 on 2 CPU ranks (gloo) and saved by Accelerate's own save_fsdp_model
// and save_fsdp_optimizer, and by dcp.save in torchtitan's LLaMA-3 names in both storage formats
// (tests/python/make_dcp_runs.py, made once per build). ndsprobe reads each as saved and equals
// transformers' float64 model and torch.optim.AdamW; so does a second copy trained and saved by
// torchtitan's own optimizer container and CheckpointManager. Damaged saves are refused by name.
#include "curv/io/dcp.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "curv/core/error.h"
#include "curv/io/checkpoint.h"
#include "curv/io/checkpoint_layout.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "curv/io/tensor_source.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;
using Catch::Matchers::Contains;

namespace {

namespace fs = std::filesystem;

// The runs make_dcp_runs.py writes, made once per build (torchrun_fixture).
const std::string& dcp_runs() {
  static const std::string path = torchrun_fixture("make_dcp_runs.py");
  return path;
}

}  // namespace

TEST_CASE("runs saved by torch.distributed.checkpoint under FSDP2 equal torch.autograd in float64",
          "[dcp][transformers][ndsprobe]") {
  const std::string root = dcp_runs();
  const nlohmann::json all = read_json(root + "/reference.json");
  INFO("torch " << all["torch"].get<std::string>());
  // (run directory, layout, its references): torchtitan's own CheckpointManager trained a second
  // copy of the model, whose references are its own.
  const auto [run, layout, trained_by] = GENERATE(table<std::string, std::string, std::string>({
      {"accelerate", "accelerate", "fsdp"},
      {"titan", "torchtitan", "fsdp"},
      {"titan_safetensors", "torchtitan", "fsdp"},
      {"torchtitan/checkpoint", "torchtitan", "torchtitan"},
  }));
  INFO(run);
  const nlohmann::json& ref = trained_by == "fsdp" ? all : all["torchtitan"];
  CHECK(detect_checkpoint_layout(root + "/" + run).name() == layout);
  TempDir out;
  audit_in_float64(root + "/" + run, root + "/probe.safetensors", out.file("probe.h5"));
  H5Reader reader(out.file("probe.h5"));
  CHECK(reader.attribute_string("/", "param_names") ==
        fmt::format("{}", fmt::join(ref["param_names"].get<std::vector<std::string>>(), ",")));
  const Table taylor = reader.table("/taylor");
  {
    INFO("delta at step 2: u = θ4 − θ2, read from both steps' shards");
    check_audit(taylor, taylor_row(taylor, 2, "delta"), ref["delta"]);
  }
  {
    INFO("adamw at step 2: torch.optim.AdamW's step from the sharded optimizer state");
    check_audit(taylor, taylor_row(taylor, 2, "adamw"), ref["adamw"]);
    const std::string name = run.substr(run.rfind('/') + 1);
    const std::string unit = fmt::format("/runs/{}/step_2/adamw", name);
    CHECK(reader.attribute_string(unit, "optimizer_rule") == "adamw");
    CHECK_THAT(reader.attribute_string(unit, "optimizer_recognition"),
               Contains("torch.optim.AdamW, recognised by keys"));
  }
}

TEST_CASE("a DCP save's optimizer state stays in its shards until a step reads it", "[dcp]") {
  const std::string root = dcp_runs();
  std::map<std::string, at::Tensor> query_state;  // run → layer 0's q_proj exp_avg
  for (const std::string run : {"accelerate", "titan"}) {
    INFO(run);
    const auto listed = list_checkpoints(root + "/" + run);
    Checkpoint ckpt = open_checkpoint(listed.front());
    std::vector<std::string> names;
    std::vector<at::Tensor> like;
    for (const auto& e : ckpt.model_source->entries()) {
      names.push_back(e.name);
      like.push_back(at::empty(e.shape, at::kDouble));
    }
    resolve_optimizer_state(ckpt, ParamSpace(names, like));
    CHECK(ckpt.optimizer.empty());
    REQUIRE(ckpt.optimizer_source);
    CHECK(ckpt.optimizer_source->entries().size() == 2 * names.size());  // exp_avg, exp_avg_sq
    const SavedOptimizer saved = saved_optimizer(ckpt);
    CHECK(saved.state == ckpt.optimizer_source);
    query_state[run] = saved.state->read("model.layers.0.self_attn.q_proj.weight.exp_avg");
  }
  // torchtitan's wq state holds each head's rows interleaved, as wq does: read in transformers'
  // order it equals the Accelerate save of the same step.
  CHECK(at::equal(query_state["accelerate"], query_state["titan"]));
}

TEST_CASE("a DCP folder is a tensor source: chunks assembled, boxes read, objects unpickled",
          "[dcp]") {
  const std::string root = dcp_runs();
  const DcpReader dcp(root + "/titan/step-2");
  const TensorEntry* e = dcp.find("tok_embeddings.weight");
  REQUIRE(e != nullptr);
  CHECK(e->shape == std::vector<int64_t>{61, 32});
  CHECK(e->dtype == at::kDouble);
  REQUIRE(dcp.chunks(e->name).size() == 2);  // one per rank
  const at::Tensor whole = dcp.read(e->name);
  // The same rows from the Accelerate save of the same training step (other names, one writer).
  const DcpReader model(root + "/accelerate/checkpoint-2/pytorch_model_fsdp_0");
  CHECK(at::equal(whole, model.read("model.model.embed_tokens.weight")));
  // A box across both ranks' chunks, into another dtype.
  at::Tensor box = at::empty({10, 5}, at::kFloat);
  dcp.read_into(e->name, {26, 3}, box);
  CHECK(at::equal(box, whole.narrow(0, 26, 10).narrow(1, 3, 5).to(at::kFloat)));
  CURV_CHECK_THROWS(dcp.read_into(e->name, {55, 0}, at::empty({10, 32}, at::kDouble)),
                    InvalidArgument, Contains("does not lie inside it"));
  // The optimizer's hyper-parameters are objects saved with torch.save.
  const PyValue::Ref lr = dcp.object("optimizer.param_groups.tok_embeddings.weight.lr");
  REQUIRE(lr->is(PyValue::Kind::kFloat));
  CHECK(lr->real == 3e-3);
  // The safetensors storage format holds the same values.
  const DcpReader st(root + "/titan_safetensors/step-2");
  CHECK(at::equal(st.read(e->name), whole));
}

TEST_CASE("damaged DCP saves are refused naming the key, the file and the offsets", "[dcp]") {
  const std::string root = dcp_runs() + "/forged";
  auto error_of = [](const std::string& folder) {
    try {
      const DcpReader dcp(folder);
      for (const auto& e : dcp.entries()) dcp.read(e.name);
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string overlap = error_of(root + "/overlap/step-2");
  CHECK_THAT(overlap, Contains("'tok_embeddings.weight'") && Contains("overlap") &&
                          Contains("offsets [20, 0]") && Contains("__1_0.distcp"));
  const std::string gap = error_of(root + "/gap/step-2");
  CHECK_THAT(gap, Contains("'tok_embeddings.weight'") && Contains("cover 1920 of its 1952") &&
                      Contains("gap"));
  const std::string outside = error_of(root + "/outside/step-2");
  CHECK_THAT(outside, Contains("'tok_embeddings.weight' of shape [61, 32]") &&
                          Contains("offsets [40, 0] sizes [30, 32]") && Contains("outside"));
  const std::string missing = error_of(root + "/missing/step-2");
  CHECK_THAT(missing, Contains("__1_0.distcp, which does not exist"));
  const std::string truncated = error_of(root + "/truncated/step-2");
  CHECK_THAT(truncated, Contains("__1_0.distcp") && Contains("truncated shard"));

  // ndsprobe: one line, a non-zero exit, no output file.
  TempDir out;
  int status = 0;
  const std::string log = run_tool("ndsprobe",
                                   fmt::format("{}/missing --data {}/probe.safetensors -o {}", root,
                                               dcp_runs(), out.file("probe.h5")),
                                   &status);
  CHECK(status != 0);
  CHECK_THAT(log, Contains("__1_0.distcp, which does not exist"));
  CHECK_FALSE(fs::exists(out.file("probe.h5")));
}

TEST_CASE("a DCP folder without .metadata is an incomplete save and is skipped", "[dcp]") {
  const std::string root = dcp_runs();
  TempDir dir;
  const std::string run = dir.file("run");
  fs::create_directories(run);
  fs::copy(root + "/titan/step-2", run + "/step-2", fs::copy_options::recursive);
  fs::copy(root + "/titan/step-4", run + "/step-4", fs::copy_options::recursive);
  fs::remove(run + "/step-4/.metadata");
  const auto listed = list_checkpoints(run);
  REQUIRE(listed.size() == 1);
  CHECK(listed.front().step == 2);
  CHECK(listed.front().layout.name() == "torchtitan");
}

TEST_CASE("the recorded digest costs a few reads and still sees a re-saved checkpoint",
          "[dcp][checkpoint]") {
  TempDir dir;
  auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
  const ParamVector theta = model->parameters();
  save_checkpoint(dir.path(), 5, model->space(), theta, {});
  const CheckpointInfo info = list_checkpoints(dir.path()).front();
  const std::string recorded = checkpoint_digest(info);
  const std::string full = checkpoint_digest(info, DigestKind::kFull);
  CHECK_THAT(recorded, Contains("recorded:"));
  CHECK_THAT(full, Contains("crc32:"));
  CHECK(digest_kind_of(recorded) == DigestKind::kRecorded);
  CHECK(digest_kind_of(full) == DigestKind::kFull);
  CHECK(checkpoint_digest(info) == recorded);  // the same files, the same digest
  // Re-saved with other values of the same shapes: the header is the same, the bytes are not.
  ParamVector moved;
  for (const auto& t : theta) moved.push_back(t.detach() + 1e-3);
  save_checkpoint(dir.path(), 5, model->space(), moved, {});
  CHECK(checkpoint_digest(info) != recorded);
  CHECK(checkpoint_digest(info, DigestKind::kFull) != full);
}

namespace {

// A layout that exists only in this file: shards-<N>/ folders holding rank0.safetensors and
// rank1.safetensors, each with the first or second half of every tensor's rows (0-dim tensors
// in rank 0), read through a tensor source of its own.
class HalvesSource : public TensorSource {
 public:
  explicit HalvesSource(const std::string& folder) : folder_(folder) {
    halves_.emplace_back(folder + "/rank0.safetensors");
    halves_.emplace_back(folder + "/rank1.safetensors");
    for (const auto& name : halves_[0].names()) {
      std::vector<int64_t> shape = halves_[0].entry(name).shape;
      if (!shape.empty()) shape[0] += halves_[1].entry(name).shape[0];
      entries_.push_back({name, shape, halves_[0].scalar_type(name)});
    }
  }
  const std::vector<TensorEntry>& entries() const override { return entries_; }
  std::string origin() const override { return folder_; }
  void read_into(const std::string& name, const std::vector<int64_t>& offsets,
                 at::Tensor dest) const override {
    const at::Tensor first = halves_[0].tensor(name);
    std::vector<int64_t> at(static_cast<size_t>(dest.dim()), 0);
    if (!offsets.empty()) at = offsets;
    if (first.dim() == 0) {
      dest.copy_(first);
      return;
    }
    copy_box_overlap(first, std::vector<int64_t>(at.size(), 0), dest, at);
    std::vector<int64_t> second_at(at.size(), 0);
    second_at[0] = first.size(0);
    copy_box_overlap(halves_[1].tensor(name), second_at, dest, at);
  }

 private:
  std::string folder_;
  std::vector<SafetensorsReader> halves_;
  std::vector<TensorEntry> entries_;
};

class HalvesLayout : public CheckpointLayoutReader {
 public:
  std::string name() const override { return "halves"; }
  std::string brief() const override { return "shards-<N>/rank0.safetensors"; }
  bool holds(const std::string& path, const std::string& entry) const override {
    return entry.rfind("shards-", 0) == 0 && fs::is_regular_file(path + "/rank0.safetensors");
  }
  int64_t step(const std::string&, const std::string& entry) const override {
    return std::stoll(entry.substr(7));
  }
  Checkpoint open(const CheckpointInfo& info, CheckpointParts) const override {
    Checkpoint ckpt;
    ckpt.step = info.step;
    ckpt.path = ckpt.model_file = ckpt.meta_file = ckpt.model_config_file = info.path;
    ckpt.model_source = std::make_shared<HalvesSource>(info.path);
    ckpt.meta =
        parse_checkpoint_meta(R"({"model": )" + tiny_gpt_config().to_json() + "}", info.path);
    return ckpt;
  }
};

}  // namespace

TEST_CASE("a sharded layout registered from a test file alone fills a model in place",
          "[dcp][checkpoint_layout]") {
  static std::once_flag once;
  std::call_once(once, [] { register_checkpoint_layout(std::make_shared<HalvesLayout>()); });
  TempDir dir;
  auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
  const ParamVector theta = model->parameters();
  const std::string folder = dir.file("shards-7");
  fs::create_directories(folder);
  std::vector<std::pair<std::string, at::Tensor>> first, second;
  for (size_t i = 0; i < theta.size(); ++i) {
    const at::Tensor t = theta[i].detach();
    const int64_t half = t.size(0) / 2;
    first.emplace_back(model->space()[i].name, t.narrow(0, 0, half).contiguous());
    second.emplace_back(model->space()[i].name, t.narrow(0, half, t.size(0) - half).contiguous());
  }
  write_safetensors(folder + "/rank0.safetensors", first);
  write_safetensors(folder + "/rank1.safetensors", second);

  const auto listed = list_checkpoints(dir.path());
  REQUIRE(listed.size() == 1);
  CHECK(listed.front().layout.name() == "halves");
  const Checkpoint ckpt = open_checkpoint(listed.front());
  REQUIRE(ckpt.model_source);
  CHECK(ckpt.model.empty());
  CHECK(model_bytes(ckpt) == static_cast<int64_t>(model->space().numel() * 8));
  // Another model of the same config, in float32, filled in place from the halves.
  auto other = make_model(tiny_gpt_config(), ModelInit{11, at::kFloat});
  fill_parameters(ckpt, other->space(), other->parameters());
  for (size_t i = 0; i < theta.size(); ++i) {
    CHECK(at::equal(other->parameters()[i], theta[i].detach().to(at::kFloat)));
  }
  // The whole-checkpoint convenience reads the same tensors.
  const Checkpoint whole = load_checkpoint(listed.front());
  REQUIRE(whole.model.size() == theta.size());
  for (const auto& [name, t] : whole.model) {
    const size_t i = *model->space().find(name);
    CHECK(at::equal(t, theta[i].detach()));
  }
}

TEST_CASE("safetensors and memory sources read boxes into any dtype; renamed views subset them",
          "[dcp][safetensors]") {
  TempDir dir;
  const at::Tensor a = at::arange(24, at::kDouble).reshape({4, 6});
  const at::Tensor b = at::arange(5, at::kFloat);
  write_safetensors(dir.file("one.safetensors"), {{"a", a}});
  write_safetensors(dir.file("two.safetensors"), {{"b", b}});
  const SharedTensorSource files =
      safetensors_source({dir.file("one.safetensors"), dir.file("two.safetensors")});
  REQUIRE(files->entries().size() == 2);
  CHECK(files->total_bytes() == 24 * 8 + 5 * 4);
  at::Tensor box = at::empty({2, 3}, at::kFloat);
  files->read_into("a", {1, 2}, box);
  CHECK(at::equal(box, a.narrow(0, 1, 2).narrow(1, 2, 3).to(at::kFloat)));
  CURV_CHECK_THROWS(files->read_into("a", {3, 0}, at::empty({2, 6}, at::kDouble)), InvalidArgument,
                    Contains("does not lie inside it"));
  CURV_CHECK_THROWS(files->read("c"), InvalidArgument, Contains("no tensor 'c'"));
  write_safetensors(dir.file("again.safetensors"), {{"a", a}});
  CURV_CHECK_THROWS(
      safetensors_source({dir.file("one.safetensors"), dir.file("again.safetensors")}), FormatError,
      Contains("tensor 'a' is in both"));
  const SharedTensorSource memory = memory_tensor_source({{"x", a}, {"y", b}}, "memory");
  const SharedTensorSource renamed = renamed_tensor_source(memory, {{"renamed_y", "y"}});
  REQUIRE(renamed->entries().size() == 1);
  CHECK(at::equal(renamed->read("renamed_y"), b));
  CHECK(renamed->find("x") == nullptr);
  // Slices: expert 1 of a fused [E, 2F, C] tensor as its gate rows and its up rows, and boxes
  // read from those.
  const at::Tensor fused = at::arange(3 * 4 * 5, at::kDouble).reshape({3, 4, 5});
  const SharedTensorSource experts = sliced_tensor_source(
      memory_tensor_source({{"gate_up", fused}}, "memory"),
      {{"e1.gate", "gate_up", {1, 0, 0}, {2, 5}}, {"e1.up", "gate_up", {1, 2, 0}, {2, 5}}});
  CHECK(at::equal(experts->read("e1.gate"), fused[1].narrow(0, 0, 2)));
  CHECK(at::equal(experts->read("e1.up"), fused[1].narrow(0, 2, 2)));
  at::Tensor corner = at::empty({1, 3}, at::kFloat);
  experts->read_into("e1.up", {1, 2}, corner);
  CHECK(at::equal(corner, fused[1].narrow(0, 3, 1).narrow(1, 2, 3).to(at::kFloat)));
  CURV_CHECK_THROWS(experts->read_into("e1.up", {1, 0}, at::empty({2, 5}, at::kDouble)),
                    InvalidArgument, Contains("does not lie inside it"));
  CURV_CHECK_THROWS(sliced_tensor_source(experts, {{"e3", "e1.up", {0, 3}, {2, 3}}}),
                    InvalidArgument,
                    Contains("the slice 'e3' at [0, 3] of shape [2, 3] does not lie inside it"));
}
