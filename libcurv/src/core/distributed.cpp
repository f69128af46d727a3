#include "curv/core/distributed.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/strings.h"

#ifdef CURV_WITH_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif
#ifdef CURV_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace curv {

namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void all_reduce_sum(double*, size_t) override {}
  void broadcast(std::string&, int root) override {
    if (root != 0) {
      throw InvalidArgument(fmt::format("broadcast from rank {} in a single process", root));
    }
  }
  void barrier() override {}
};

const char* getenv_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int64_t env_integer(const char* name, int64_t low, int64_t high) {
  const char* text = getenv_or_null(name);
  if (!text) {
    throw InvalidArgument(fmt::format(
        "environment variable {} is not set (WORLD_SIZE > 1 needs RANK, MASTER_ADDR and "
        "MASTER_PORT too: launch with torchrun, or set them as docs/distributed.md shows)",
        name));
  }
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < low || value > high) {
    throw InvalidArgument(
        fmt::format("environment variable {}='{}': expected an integer in [{}, {}]", name,
                    printable_message(text), low, high));
  }
  return value;
}

#ifdef CURV_WITH_GLOO

// The message of an exception from c10d or gloo without c10's backtrace.
std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return brief_what(std::runtime_error(c10_error->what_without_backtrace()));
  }
  return brief_what(e);
}

// c10d's Gloo process group (and, with `nccl`, an NCCL one for device tensors), plus a heartbeat
// in the store: when a collective fails, the ranks whose heartbeat stopped are the lost ones (a
// slow rank still beats; a killed one does not).
class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(int rank, int world, std::string host, int port, bool agent_store,
                   std::chrono::milliseconds timeout, bool nccl)
      : rank_(rank), world_(world), host_(std::move(host)), port_(port) {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(port);
    store_options.isServer = rank == 0 && !agent_store;
    store_options.numWorkers = static_cast<size_t>(world);
    store_options.waitWorkers = false;
    store_options.timeout = timeout;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(host_, store_options);
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      if (const char* ifname = getenv_or_null("GLOO_SOCKET_IFNAME")) {
        // A comma-separated list, as torch.distributed reads it.
        std::string names = ifname;
        for (size_t start = 0; start <= names.size();) {
          const size_t end = std::min(names.find(',', start), names.size());
          if (end > start) {
            options->devices.push_back(
                c10d::ProcessGroupGloo::createDeviceForInterface(names.substr(start, end - start)));
          }
          start = end + 1;
        }
      } else {
        options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      options->threads = 1;
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("curv", store_);
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, world, options);
#ifdef CURV_WITH_NCCL
      if (nccl) {
        // Its communicator is created on the first collective, on the device of its tensors.
        auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
        nccl_options->timeout = timeout;
        nccl_group_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(
            c10::make_intrusive<c10d::PrefixStore>("curv_nccl", store_), rank, world, nccl_options);
      }
#else
      (void)nccl;
#endif
      // The heartbeat gets its own connection: a collective's store traffic never waits on it.
      c10d::TCPStoreOptions client = store_options;
      client.isServer = false;
      heartbeat_store_ = c10::make_intrusive<c10d::TCPStore>(host_, client);
    } catch (const std::exception& e) {
      throw DistributedError(
          fmt::format("rank {} of {}: the rendezvous at {}:{} failed within {} s: {}", rank, world,
                      host_, port, timeout.count() / 1000, message_of(e)));
    }
    beat();
    heartbeat_ = std::thread([this] { heartbeat_loop(); });
  }

  ~C10dCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override {
#ifdef CURV_WITH_NCCL
    if (nccl_group_) return "gloo+nccl";
#endif
    return "gloo";
  }

  void all_reduce_sum(double* data, size_t n) override {
    if (n == 0) return;
    std::vector<at::Tensor> tensors{
        at::from_blob(data, {static_cast<int64_t>(n)}, at::TensorOptions().dtype(at::kDouble))};
    run("an all-reduce", n * sizeof(double), [&] { return group_->allreduce(tensors); });
  }

  void all_reduce_sum_on_device(at::Tensor& data) override {
#ifdef CURV_WITH_NCCL
    if (nccl_group_ && data.is_cuda()) {
      std::vector<at::Tensor> tensors{data};
      // wait() orders the sum before later work on the current stream.
      run("an all-reduce on the GPU", static_cast<size_t>(data.nbytes()),
          [&] { return nccl_group_->allreduce(tensors); });
      return;
    }
#endif
    Communicator::all_reduce_sum_on_device(data);
  }

  void broadcast(std::string& bytes, int root) override {
    if (root < 0 || root >= world_) {
      throw InvalidArgument(fmt::format("broadcast from rank {} of {}", root, world_));
    }
    std::vector<at::Tensor> size{at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    run("a broadcast", sizeof(int64_t), [&] { return group_->broadcast(size, options); });
    const int64_t n = size[0].item<int64_t>();
    if (n == 0) {
      bytes.clear();
      return;
    }
    bytes.resize(static_cast<size_t>(n));
    std::vector<at::Tensor> payload{at::from_blob(bytes.data(), {n}, at::kByte)};
    run("a broadcast", static_cast<size_t>(n), [&] { return group_->broadcast(payload, options); });
  }

  void barrier() override {
    run("a barrier", 0, [&] { return group_->barrier(); });
  }

 private:
  template <typename Start>
  void run(const char* what, size_t bytes, Start start) {
    try {
      start()->wait();
    } catch (const std::exception& e) {
      throw DistributedError(fmt::format("rank {} of {}: {} of {} bytes failed: {}; {}", rank_,
                                         world_, what, bytes, lost_ranks(), message_of(e)));
    }
  }

  std::string key(int rank) const { return fmt::format("curv_heartbeat/{}", rank); }

  void beat() { heartbeat_store_->add(key(rank_), 1); }

  void heartbeat_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, kBeat);
      if (stopping_) break;
      try {
        beat();
      } catch (const std::exception&) {
        return;  // the store is gone: the next collective reports it
      }
    }
  }

  // Which ranks stopped beating: two readings of every counter, three beats apart.
  std::string lost_ranks() {
    try {
      std::vector<int64_t> before(static_cast<size_t>(world_));
      for (int r = 0; r < world_; ++r) before[r] = store_->add(key(r), 0);
      std::this_thread::sleep_for(3 * kBeat);
      std::vector<int> lost;
      for (int r = 0; r < world_; ++r) {
        if (r != rank_ && store_->add(key(r), 0) == before[r]) lost.push_back(r);
      }
      if (lost.empty()) return "every rank still answers (a rank failed on its own, or timed out)";
      return fmt::format("lost rank{} {} (no heartbeat for {} s)", lost.size() > 1 ? "s" : "",
                         fmt::join(lost, ", "), 3 * kBeat.count() / 1000.0);
    } catch (const std::exception&) {
      return fmt::format("lost rank 0 or the store it hosted at {}:{} (it no longer answers)",
                         host_, port_);
    }
  }

  static constexpr std::chrono::milliseconds kBeat{1000};
  int rank_, world_;
  std::string host_;
  int port_;
  c10::intrusive_ptr<c10d::Store> store_, heartbeat_store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
#ifdef CURV_WITH_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl_group_;
#endif
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread heartbeat_;
};

#endif  // CURV_WITH_GLOO

// The error types a failure keeps across ranks, as codes in the flag buffer.
enum FailureCode { kNone = 0, kInvalid, kFormat, kModel, kNumerical, kDistributed, kOther };

int failure_code(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument&) {
    return kInvalid;
  } catch (const FormatError&) {
    return kFormat;
  } catch (const ModelError&) {
    return kModel;
  } catch (const NumericalError&) {
    return kNumerical;
  } catch (const DistributedError&) {
    return kDistributed;
  } catch (...) {
    return kOther;
  }
}

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

[[noreturn]] void throw_as(int code, const std::string& message) {
  switch (code) {
    case kInvalid:
      throw InvalidArgument(message);
    case kFormat:
      throw FormatError(message);
    case kModel:
      throw ModelError(message);
    case kNumerical:
      throw NumericalError(message);
    case kDistributed:
      throw DistributedError(message);
    default:
      throw Error(message);
  }
}

}  // namespace

void Communicator::all_reduce_sum_on_device(at::Tensor& data) {
  if (!distributed() || data.numel() == 0) return;
  const bool host =
      data.device().is_cpu() && data.scalar_type() == at::kDouble && data.is_contiguous();
  at::Tensor buffer = host ? data : data.to(at::kCPU, at::kDouble).contiguous();
  all_reduce_sum(buffer.data_ptr<double>(), static_cast<size_t>(buffer.numel()));
  if (!host) data.copy_(buffer);
}

std::shared_ptr<Communicator> single_process() {
  static const auto instance = std::make_shared<SingleProcess>();
  return instance;
}

void DistributedOptions::validate() const {
  if (timeout_seconds < 1) {
    throw InvalidOption("{0} must be at least 1", {{"DistributedOptions.timeout_seconds",
                                                    fmt::format("{}", timeout_seconds)}});
  }
}

std::string distributed_backends() {
#if defined(CURV_WITH_NCCL)
  return "gloo, nccl";
#elif defined(CURV_WITH_GLOO)
  return "gloo";
#else
  return "";
#endif
}

std::string device_of_rank(const std::string& device) {
  const char* world = getenv_or_null("WORLD_SIZE");
  if (device != "cuda" || !world || env_integer("WORLD_SIZE", 1, 1 << 20) == 1) return device;
  return fmt::format("cuda:{}", env_integer("LOCAL_RANK", 0, 1 << 16));
}

std::shared_ptr<Communicator> communicator_from_environment(const DistributedOptions& options) {
  options.validate();
  if (!getenv_or_null("WORLD_SIZE")) return single_process();
  const auto world = static_cast<int>(env_integer("WORLD_SIZE", 1, 1 << 20));
  if (world == 1) return single_process();
  const auto rank = static_cast<int>(env_integer("RANK", 0, world - 1));
  const auto port = static_cast<int>(env_integer("MASTER_PORT", 1, 65535));
  const char* host = getenv_or_null("MASTER_ADDR");
  if (!host) env_integer("MASTER_ADDR", 0, 0);  // throws the "not set" message
  const char* agent = getenv_or_null("TORCHELASTIC_USE_AGENT_STORE");
  const bool agent_store = agent && std::string(agent) == "True";
#ifdef CURV_WITH_GLOO
  const bool nccl = options.device.rfind("cuda", 0) == 0;
  return std::make_shared<C10dCommunicator>(rank, world, host, port, agent_store,
                                            std::chrono::seconds(options.timeout_seconds), nccl);
#else
  (void)rank, (void)port, (void)agent_store;
  throw DistributedError(fmt::format(
      "WORLD_SIZE={} asks for {} processes, but this build of libcurv has no data-parallel "
      "backend: its LibTorch came without gloo's headers (install Debian's libgloo-dev, or point "
      "CMake's CURV_GLOO_INCLUDE_DIR at a gloo checkout, and rebuild)",
      world, world));
#endif
}

void raise_if_any_rank_failed(Communicator& comm, const std::exception_ptr& local_error) {
  if (!comm.distributed()) {
    if (local_error) std::rethrow_exception(local_error);
    return;
  }
  const auto world = static_cast<size_t>(comm.world_size());
  std::vector<double> codes(world, 0.0);
  if (local_error) codes[static_cast<size_t>(comm.rank())] = failure_code(local_error);
  comm.all_reduce_sum(codes.data(), world);
  for (size_t r = 0; r < world; ++r) {
    if (static_cast<int>(codes[r]) == kNone) continue;
    std::string message =
        static_cast<int>(r) == comm.rank() ? message_of(local_error) : std::string();
    comm.broadcast(message, static_cast<int>(r));
    const int code = static_cast<int>(codes[r]);
    // A message that already names its rank (a DistributedError) is not prefixed twice.
    if (code == kDistributed && message.rfind("rank ", 0) == 0) throw_as(code, message);
    throw_as(code, fmt::format("rank {}: {}", r, message));
  }
}

void on_root(Communicator& comm, const std::function<void()>& body) {
  std::exception_ptr failure;
  if (comm.is_root()) {
    try {
      body();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  raise_if_any_rank_failed(comm, failure);
}

void check_same_on_all_ranks(Communicator& comm, uint64_t digest, const std::string& what) {
  if (!comm.distributed()) return;
  // Two 32-bit halves per rank: doubles hold them exactly, and the sums leave them apart.
  const auto world = static_cast<size_t>(comm.world_size());
  std::vector<double> halves(2 * world, 0.0);
  const auto r = static_cast<size_t>(comm.rank());
  halves[2 * r] = static_cast<double>(digest >> 32);
  halves[2 * r + 1] = static_cast<double>(digest & 0xffffffffULL);
  comm.all_reduce_sum(halves.data(), halves.size());
  for (size_t k = 1; k < world; ++k) {
    if (halves[2 * k] != halves[0] || halves[2 * k + 1] != halves[1]) {
      throw DistributedError(fmt::format(
          "the ranks' {} differ (rank {} from rank 0): every rank must run the same build with "
          "the same number of threads, so that the same reduced gradient gives the same step",
          what, k));
    }
  }
}

std::vector<size_t> balanced_split(const std::vector<double>& sizes, int world) {
  if (world < 1) throw InvalidArgument(fmt::format("balanced_split: world size {}", world));
  const size_t n = sizes.size();
  std::vector<double> before(n + 1, 0.0);  // total size of the items before item i
  for (size_t i = 0; i < n; ++i) before[i + 1] = before[i] + sizes[i];
  const double total = before[n];
  std::vector<size_t> first(static_cast<size_t>(world) + 1, n);
  first[0] = 0;
  for (int r = 1; r < world; ++r) {
    const double target = total * r / world;
    // The boundary nearest to the target, never before the previous rank's.
    size_t best = first[r - 1];
    for (size_t i = first[r - 1]; i <= n; ++i) {
      // Ties go to the later boundary, so that with fewer items than ranks the first ranks
      // (rank 0 among them) get the work.
      if (std::abs(before[i] - target) <= std::abs(before[best] - target)) {
        best = i;
      }
    }
    first[r] = best;
  }
  return first;
}

}  // namespace curv
