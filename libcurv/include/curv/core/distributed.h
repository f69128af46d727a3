// Data parallelism across processes: a small communicator (rank, world size, sums and broadcasts
// of float64 buffers) over torch's c10d engine — a TCPStore for the rendezvous,
// ProcessGroupGloo for host collectives and, in a CUDA build whose ranks run on GPUs,
// ProcessGroupNCCL for sums of device tensors — configured from torchrun's environment. The
// single-process communicator is the default everywhere and does nothing.
//
// Every collective must be called by all ranks in the same order. A rank that dies or stops
// answering turns the collective on every other rank into a DistributedError that names it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "curv/core/error.h"

namespace at {
class Tensor;
}

namespace curv {

// A collective failed: a rank died, hung past the timeout, or failed on its own (then every rank
// throws the same message, naming the rank where it happened).
class DistributedError : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "single" for one process, "gloo" for c10d's ProcessGroupGloo, "gloo+nccl" when device
  // tensors are summed by ProcessGroupNCCL.
  virtual std::string backend() const = 0;
  // data[i] ← Σ_ranks data[i], in place. Every rank ends with the same bits.
  virtual void all_reduce_sum(double* data, size_t n) = 0;
  // The same for a contiguous float64 tensor, in place on its device: by NCCL for a CUDA tensor
  // when the backend has it, otherwise through a host copy summed as above.
  virtual void all_reduce_sum_on_device(at::Tensor& data);
  // `bytes` ← root's bytes on every rank (any length).
  virtual void broadcast(std::string& bytes, int root) = 0;
  virtual void barrier() = 0;

  bool is_root() const { return rank() == 0; }
  bool distributed() const { return world_size() > 1; }
};

// The single-process communicator (rank 0 of 1): sums and broadcasts leave their data as it is.
std::shared_ptr<Communicator> single_process();

struct DistributedOptions {
  // A collective that waits longer than this for another rank fails with DistributedError.
  int64_t timeout_seconds = 1800;
  // The device the ranks compute on ("cpu", "cuda", "cuda:N"): on CUDA, in a build with NCCL,
  // device tensors are summed by NCCL.
  std::string device = "cpu";
  void validate() const;
};

// The communicator torchrun's environment describes: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// (LOCAL_RANK is not needed on CPU). Rank 0 hosts the TCPStore, unless
// TORCHELASTIC_USE_AGENT_STORE=True says torchrun's agent hosts it. GLOO_SOCKET_IFNAME picks the
// network interface (else the address this machine's hostname resolves to, or the loopback).
// Without WORLD_SIZE, or WORLD_SIZE=1, the single-process communicator. InvalidArgument names
// the variable that is missing or malformed; DistributedError when this build has no c10d Gloo
// (distributed_backends() is empty) or the rendezvous fails.
std::shared_ptr<Communicator> communicator_from_environment(const DistributedOptions& options = {});

// The backends compiled into this build: "gloo", "gloo, nccl" (a CUDA LibTorch with NCCL's
// headers), or empty when the gloo headers were missing at build time (official LibTorch
// archives do not ship them).
std::string distributed_backends();

// The device of this rank: under torchrun (WORLD_SIZE > 1) a bare "cuda" becomes
// "cuda:LOCAL_RANK", one GPU per rank of a node; anything else is returned as it is.
// InvalidArgument when LOCAL_RANK is missing or malformed there.
std::string device_of_rank(const std::string& device);

// A collective, called by every rank after work that may have failed on some of them:
// `local_error` is this rank's failure (null when it succeeded). When any rank failed, every rank
// throws the same error: the lowest failing rank's, with its type (InvalidArgument, FormatError,
// ModelError, NumericalError, DistributedError, else Error) and its message prefixed "rank R: ".
// With one process it rethrows `local_error` unchanged.
void raise_if_any_rank_failed(Communicator& comm, const std::exception_ptr& local_error);

// Runs `body` on rank 0 alone (a file only rank 0 writes) and raises its failure on every rank: a
// collective.
void on_root(Communicator& comm, const std::function<void()>& body);

// Stops every rank with DistributedError when the ranks' `digest`s of something that must be the
// same everywhere (`what`, e.g. "parameters after step 50") differ: a collective.
void check_same_on_all_ranks(Communicator& comm, uint64_t digest, const std::string& what);

// The balanced contiguous split of items of the given sizes (e.g. a probe set's batches by
// examples): rank r gets items [first[r], first[r + 1]), first[r] being the item boundary nearest
// to r/world of the total size. Returns the world + 1 boundaries.
std::vector<size_t> balanced_split(const std::vector<double>& sizes, int world);

}  // namespace curv
