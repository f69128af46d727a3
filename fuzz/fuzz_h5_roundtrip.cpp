// HDF5 results files that libhdf5 itself wrote correctly: the input is a program of H5Writer
// calls (groups, datasets of every kind and shape, attributes, removals; names and values from
// the input, misuse rejected as InvalidArgument) whose file is committed, loaded with
// H5Writer::load, committed again, and read back as --resume reads it. Covers libcurv's side of
// HDF5 without feeding libhdf5 corrupt metadata (fuzz_h5_resume does that).
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include "curv/io/h5_file.h"
#include "fuzz_h5_read.h"
#include "fuzz_support.h"

namespace {

std::string object_path(FuzzedDataProvider& in) {
  static const char* kKnown[] = {"/",
                                 "/taylor",
                                 "/status",
                                 "/runs/run/step_0",
                                 "/runs/run",
                                 "/token_buckets",
                                 "/runs/run/step_0/delta"};
  if (in.ConsumeBool()) return kKnown[in.ConsumeIntegralInRange<size_t>(0, 6)];
  return "/" + in.ConsumeRandomLengthString(12);
}

std::string attribute_name(FuzzedDataProvider& in) {
  static const char* kKnown[] = {"columns", "model", "dtype",  "probe_hash",
                                 "blocks",  "seed",  "schema", "checkpoint_digest"};
  if (in.ConsumeBool()) return kKnown[in.ConsumeIntegralInRange<size_t>(0, 7)];
  return in.ConsumeRandomLengthString(12);
}

std::vector<uint64_t> dims_for(FuzzedDataProvider& in, size_t n) {
  if (in.ConsumeBool()) return {};
  std::vector<uint64_t> dims(in.ConsumeIntegralInRange<size_t>(1, 3));
  for (auto& d : dims) d = in.ConsumeIntegralInRange<uint64_t>(0, 8);
  if (in.ConsumeBool() && !dims.empty()) dims.back() = n;  // sometimes consistent
  return dims;
}

void one_call(curv::H5Writer& w, FuzzedDataProvider& in) {
  const std::string path = object_path(in);
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 6);
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:
      w.group(path);
      break;
    case 1: {
      std::vector<double> v(n);
      for (auto& x : v) x = in.ConsumeFloatingPoint<double>();
      w.dataset(path, v, dims_for(in, n));
      break;
    }
    case 2: {
      std::vector<int64_t> v(n);
      for (auto& x : v) x = in.ConsumeIntegral<int64_t>();
      w.dataset(path, v, dims_for(in, n));
      break;
    }
    case 3: {
      std::vector<std::string> v(n);
      for (auto& x : v) x = in.ConsumeRandomLengthString(16);
      w.dataset(path, v);
      break;
    }
    case 4:
      w.attribute(path, attribute_name(in), in.ConsumeFloatingPoint<double>());
      break;
    case 5:
      w.attribute(path, attribute_name(in), in.ConsumeRandomLengthString(24));
      break;
    case 6:
      w.attribute(path, attribute_name(in), in.ConsumeIntegral<int64_t>());
      break;
    case 7: {
      std::vector<double> v(n);
      for (auto& x : v) x = in.ConsumeFloatingPoint<double>();
      w.attribute(path, attribute_name(in), v);
      break;
    }
    case 8: {
      std::vector<std::string> v(n);
      for (auto& x : v) x = in.ConsumeRandomLengthString(12);
      w.attribute(path, attribute_name(in), v);
      break;
    }
    default:
      w.remove(path);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  return curv::fuzz::run_expecting_clean_errors([&] {
    const std::string path = curv::fuzz::scratch_dir() + "/built.h5";
    curv::H5Writer w(path);
    for (int calls = 0; calls < 48 && in.remaining_bytes() > 0; ++calls) {
      try {
        one_call(w, in);
      } catch (const curv::InvalidArgument&) {
        // misuse of the writer, rejected at the call: go on with the next call
      }
    }
    w.commit();
    curv::H5Writer::load(path).commit();
    curv::fuzz::read_back(path);
  });
}
