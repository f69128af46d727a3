// An existing HDF5 results file read back for --resume, from raw bytes: H5Writer::load (every
// group, dataset and attribute into the in-memory description), H5Reader walking the whole tree,
// and ProbeReport's resume with the provenance the file claims. Crashes inside libhdf5 1.10's own
// parser are outside libcurv's reach (docs/reliability.md#crashes-found-and-fixed), so
// scripts/fuzz.sh runs this harness only when named.
#include "curv/io/h5_file.h"
#include "fuzz_h5_read.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  curv::fuzz::run_expecting_clean_errors([&] {
    const std::string path = curv::fuzz::write_file("input.h5", data, size);
    (void)curv::H5Writer::load(path);
  });
  return curv::fuzz::run_expecting_clean_errors(
      [&] { curv::fuzz::read_back(curv::fuzz::write_file("input.h5", data, size)); });
}
