// Time to read a checkpoint the way ndsprobe reads one, for comparison with torch.load and
// safetensors.torch.load_file on the same files (bench/python/read_checkpoint.py; both side by
// side: bench/checkpoint_read.sh).
//
//   checkpoint_read_bench RUN_DIR [--step N] [--layout auto] [--model CONFIG] [--mode both]
//       [--device cpu] [--dtype float32] [--repeats 5] [--threads 2] [--evict first] [--seed 0]
//
// RUN_DIR is a run directory as ndsprobe takes it (native step_<N>/, nanoGPT ckpt.pt, Hugging Face
// checkpoint-<N>/, step_<N>.pt); --step picks one checkpoint (default: the last), --layout and
// --model (for checkpoints that record no model config) are ndsprobe's. Two timings:
//   read   curv::load_checkpoint(model only): the files into host tensors, as stored;
//   model  the whole way into a model on --device: read, build the model from the checkpoint's
//          config (curv::load_model, its parameters not drawn, as run_probe_job), convert to the
//          model's dtype and device (curv::parameters_from) and copy into its parameters
//          (curv::load_parameters, as CurvatureEngine::set_parameters does); the clock stops after
//          the device finished.
// --evict first|each|none drops the checkpoint's files from the page cache (fdatasync, then
// posix_fadvise DONTNEED: no privileges needed) before the first or every repeat of each timing,
// so that it reads from the disk; the page cache is warm after the first repeat. Before each
// repeat the fraction of the weight files resident in the page cache is printed. One line per
// repeat, then the first and the median of all repeats and one "RESULT" line per timing for the
// script.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "curv/core/objective.h"
#include "curv/core/runtime.h"
#include "curv/io/checkpoint.h"
#include "curv/models/model_loader.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Args {
  std::string run_dir, model, layout = "auto", mode = "both", device = "cpu", dtype = "float32",
                              evict = "first";
  int64_t step = -1;  // -1: the last checkpoint
  int repeats = 5, threads = 2;
  uint64_t seed = 0;
};

// False (after naming it on stderr) for an unknown flag or a missing RUN_DIR.
bool parse_args(int argc, char** argv, Args& a) {
  int i = 1;
  if (argc > 1 && argv[1][0] != '-') a.run_dir = argv[i++];
  for (; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--step")
      a.step = std::stoll(value);
    else if (flag == "--model")
      a.model = value;
    else if (flag == "--layout")
      a.layout = value;
    else if (flag == "--mode")
      a.mode = value;
    else if (flag == "--device")
      a.device = value;
    else if (flag == "--dtype")
      a.dtype = value;
    else if (flag == "--repeats")
      a.repeats = std::max(1, std::stoi(value));
    else if (flag == "--threads")
      a.threads = std::stoi(value);
    else if (flag == "--evict")
      a.evict = value;
    else if (flag == "--seed")
      a.seed = std::stoull(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return false;
    }
  }
  if (i < argc) std::fprintf(stderr, "flag %s has no value\n", argv[i]);
  if (a.run_dir.empty()) std::fprintf(stderr, "usage: checkpoint_read_bench RUN_DIR [flags]\n");
  const bool modes_ok = a.mode == "read" || a.mode == "model" || a.mode == "both";
  const bool evict_ok = a.evict == "first" || a.evict == "each" || a.evict == "none";
  if (!modes_ok || !evict_ok)
    std::fprintf(stderr, "--mode read|model|both, --evict first|each|none\n");
  return i == argc && !a.run_dir.empty() && modes_ok && evict_ok;
}

// Every regular file of the checkpoint (its folder's files, or the file).
std::vector<fs::path> checkpoint_files(const curv::CheckpointInfo& info) {
  if (!fs::is_directory(info.path)) return {info.path};
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(info.path)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool starts_ends(const std::string& name, const std::string& begin, const std::string& end) {
  return name.size() >= begin.size() + end.size() && name.rfind(begin, 0) == 0 &&
         name.compare(name.size() - end.size(), end.size(), end) == 0;
}

// The files whose bytes a model-only read takes its tensors from: the file itself, or the folder's
// model.safetensors, pytorch_model.bin, or the shards of an index (model-*.safetensors,
// pytorch_model-*.bin). GB/s are of these files' size.
std::vector<fs::path> weight_files(const curv::CheckpointInfo& info) {
  if (!fs::is_directory(info.path)) return {info.path};
  const fs::path dir(info.path);
  for (const char* name : {"model.safetensors", "pytorch_model.bin"}) {
    if (fs::is_regular_file(dir / name)) return {dir / name};
  }
  std::vector<fs::path> shards;
  for (const auto& file : checkpoint_files(info)) {
    const std::string name = file.filename().string();
    if (starts_ends(name, "model-", ".safetensors") || starts_ends(name, "pytorch_model-", ".bin"))
      shards.push_back(file);
  }
  return shards;
}

int64_t total_size(const std::vector<fs::path>& files) {
  int64_t bytes = 0;
  for (const auto& f : files) bytes += static_cast<int64_t>(fs::file_size(f));
  return bytes;
}

// Writes back and drops the files' pages from the page cache; clean pages go, unless another
// process maps them.
void evict(const std::vector<fs::path>& files) {
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// The fraction of the files' pages in the page cache (mincore on a mapping); -1 if unknown.
double resident_fraction(const std::vector<fs::path>& files) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t pages = 0, resident = 0;
  for (const auto& f : files) {
    const auto size = static_cast<size_t>(fs::file_size(f));
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0 || size == 0) {
      if (fd >= 0) ::close(fd);
      continue;
    }
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return -1;
    std::vector<unsigned char> in_core((size + page - 1) / page);
    const bool ok = ::mincore(map, size, in_core.data()) == 0;
    ::munmap(map, size);
    if (!ok) return -1;
    pages += static_cast<int64_t>(in_core.size());
    for (unsigned char c : in_core) resident += c & 1;
  }
  return pages > 0 ? static_cast<double>(resident) / pages : -1;
}

// Waits for the device's queued work (a no-op on the CPU): one scalar read back, which LibTorch
// 1.13 and 2.x both have.
void finish(const c10::Device& device) {
  if (!device.is_cpu()) at::zeros({1}, at::TensorOptions().device(device)).item<float>();
}

// One pass of the "model" path; seconds of each phase.
struct ModelTimes {
  double read = 0, build = 0, convert = 0, copy = 0, total = 0;
  int64_t parameters = 0;
};

ModelTimes read_into_model(const curv::CheckpointInfo& info, const curv::ModelSource& source) {
  const c10::Device device(source.init.device);
  ModelTimes t;
  const auto start = Clock::now();
  curv::Checkpoint ckpt = curv::load_checkpoint(info, curv::CheckpointParts::kModelOnly);
  t.read = seconds_since(start);
  // As run_probe_job: the stored element count checks the config before anything is allocated.
  curv::StoredWeights weights;
  weights.elements = 0;
  for (const auto& entry : ckpt.model) weights.elements += entry.second.numel();
  weights.origin = ckpt.model_file;
  auto mark = Clock::now();
  curv::LoadedModel model = curv::load_model(
      source, ckpt.model_config_json(),
      ckpt.model_config_file.empty() ? ckpt.meta_file : ckpt.model_config_file, weights);
  curv::Objective& objective = *model.objective;
  finish(device);
  t.build = seconds_since(mark);
  // As ProbeRun::load_checkpoint_state: the parameters in the model's dtype and on its device.
  mark = Clock::now();
  const curv::ModelStructure structure = objective.structure();
  const curv::ParamVector like = objective.parameters();
  curv::ParamVector theta = curv::parameters_from(ckpt, objective.space(), like, false, &structure);
  ckpt.model.clear();
  finish(device);
  t.convert = seconds_since(mark);
  mark = Clock::now();
  curv::load_parameters(objective, theta);
  finish(device);
  t.copy = seconds_since(mark);
  t.total = seconds_since(start);
  t.parameters = objective.space().numel();
  return t;
}

// The checkpoint RUN_DIR --step selects (the last one without --step).
curv::CheckpointInfo chosen_checkpoint(const Args& a) {
  const curv::StepSelection selection =
      a.step < 0 ? curv::StepSelection{} : curv::StepSelection::parse(std::to_string(a.step));
  const auto all =
      curv::list_checkpoints(a.run_dir, selection, curv::parse_checkpoint_layout(a.layout));
  return all.back();
}

// `build`: the model timing's build phases (empty for the read timing).
void print_result(const char* what, const Args& a, const std::vector<double>& times,
                  const std::vector<double>& build, int64_t file_bytes, int64_t tensor_bytes,
                  double first_resident) {
  const double first = times.front(), mid = median(times);
  std::printf("%-5s first %.4f s (%.2f GB/s), median %.4f s (%.2f GB/s) of %zu repeats\n", what,
              first, file_bytes / first / 1e9, mid, file_bytes / mid / 1e9, times.size());
  std::printf(
      "RESULT side=libcurv what=%s device=%s dtype=%s repeats=%zu first_s=%.6f median_s=%.6f "
      "min_s=%.6f build_median_s=%.6f file_bytes=%lld tensor_bytes=%lld first_resident=%.3f "
      "evict=%s\n",
      what, a.device.c_str(), a.dtype.c_str(), times.size(), first, mid,
      *std::min_element(times.begin(), times.end()), build.empty() ? 0.0 : median(build),
      static_cast<long long>(file_bytes), static_cast<long long>(tensor_bytes), first_resident,
      a.evict.c_str());
  std::fflush(stdout);
}

// Reads (mode "read") or loads into a model (mode "model") `repeats` times.
void time_mode(const std::string& mode, const Args& a, const curv::CheckpointInfo& info) {
  const std::vector<fs::path> files = checkpoint_files(info), weights = weight_files(info);
  const int64_t file_bytes = total_size(weights);
  curv::ModelSource source;
  source.path = a.model;
  source.init = curv::ModelInit{a.seed, curv::parse_dtype(a.dtype), a.device};
  source.init.draw = false;  // as run_probe_job: every parameter comes from the checkpoint
  std::vector<double> times, build;
  int64_t tensor_bytes = 0;
  double first_resident = -1;
  for (int r = 0; r < a.repeats; ++r) {
    if (a.evict == "each" || (a.evict == "first" && r == 0)) evict(files);
    const double resident = resident_fraction(weights);
    if (r == 0) first_resident = resident;
    if (mode == "read") {
      const auto start = Clock::now();
      curv::Checkpoint ckpt = curv::load_checkpoint(info, curv::CheckpointParts::kModelOnly);
      times.push_back(seconds_since(start));
      tensor_bytes = 0;
      for (const auto& entry : ckpt.model) tensor_bytes += entry.second.nbytes();
      std::printf("read  repeat %d: %.4f s, %.2f GB/s (%.0f%% in page cache before)\n", r + 1,
                  times.back(), file_bytes / times.back() / 1e9, 100 * resident);
    } else {
      const ModelTimes t = read_into_model(info, source);
      times.push_back(t.total);
      build.push_back(t.build);
      tensor_bytes = t.parameters * static_cast<int64_t>(c10::elementSize(source.init.dtype));
      std::printf(
          "model repeat %d: %.4f s, %.2f GB/s = read %.4f + build %.4f + convert %.4f + copy "
          "%.4f (%.0f%% in page cache before)\n",
          r + 1, t.total, file_bytes / t.total / 1e9, t.read, t.build, t.convert, t.copy,
          100 * resident);
    }
    std::fflush(stdout);
  }
  print_result(mode.c_str(), a, times, build, file_bytes, tensor_bytes, first_resident);
}

int run(const Args& a) {
  curv::init_runtime(curv::RuntimeOptions{a.threads});
  const curv::CheckpointInfo info = chosen_checkpoint(a);
  const c10::Device device(a.device);
  finish(device);  // the device's start-up stays outside every clock
  const std::vector<fs::path> weights = weight_files(info);
  std::printf("%s\n", curv::runtime_summary().c_str());
  std::printf("checkpoint %s (step %lld, layout %s): %s%s, %.1f MB to read; model %s on %s\n",
              info.path.c_str(), static_cast<long long>(info.step),
              curv::layout_name(info.layout).c_str(),
              weights.empty() ? "?" : weights.front().filename().c_str(),
              weights.size() > 1 ? " and more" : "", total_size(weights) / 1e6, a.dtype.c_str(),
              a.device.c_str());
  std::fflush(stdout);
  if (a.mode != "model") time_mode("read", a, info);
  if (a.mode != "read") time_mode("model", a, info);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  curv::reexec_for_blas_kernels(argv);  // as the tools: the same process set-up
  Args a;
  if (!parse_args(argc, argv, a)) return 2;
  try {
    return run(a);
  } catch (const c10::Error& e) {  // e.g. no CUDA device
    std::fprintf(stderr, "checkpoint_read_bench: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {  // curv::Error and the rest
    std::fprintf(stderr, "checkpoint_read_bench: %s\n", e.what());
    return 1;
  }
}
