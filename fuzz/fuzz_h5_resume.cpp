// An existing HDF5 results file read back for --resume: H5Writer::load (every group, dataset and
// attribute into the in-memory description), H5Reader walking the whole tree, and ProbeReport's
// resume with the provenance the file itself claims (so the tables and digests are read too).
// Crashes inside libhdf5 itself are outside libcurv's reach; docs/reliability.md lists any.
#include <cstdlib>
#include <functional>

#include "curv/analysis/report.h"
#include "curv/io/h5_file.h"
#include "fuzz_support.h"

namespace {

void walk(const curv::H5Reader& reader, const std::string& path, int depth) {
  if (depth > 16) return;
  for (const auto& name : reader.attribute_names(path)) {
    try {
      (void)reader.attribute_string(path, name);
    } catch (const curv::Error&) {
    }
    try {
      (void)reader.attribute_doubles(path, name);
    } catch (const curv::Error&) {
    }
  }
  if (reader.is_dataset(path)) {
    std::vector<uint64_t> dims;
    try {
      (void)reader.doubles(path, &dims);
    } catch (const curv::Error&) {
    }
    try {
      (void)reader.strings(path);
    } catch (const curv::Error&) {
    }
    return;
  }
  if (reader.has_attribute(path, "columns")) {
    try {
      (void)reader.table(path);
    } catch (const curv::Error&) {
    }
  }
  for (const auto& child : reader.children(path)) {
    walk(reader, path == "/" ? "/" + child : path + "/" + child, depth + 1);
  }
}

std::string root_string(const curv::H5Reader& reader, const char* key) {
  try {
    if (reader.has_attribute("/", key)) return reader.attribute_string("/", key);
  } catch (const curv::Error&) {
  }
  return "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  curv::fuzz::run_expecting_clean_errors([&] {
    const std::string path = curv::fuzz::write_file("input.h5", data, size);
    (void)curv::H5Writer::load(path);
  });
  curv::fuzz::run_expecting_clean_errors([&] {
    const std::string path = curv::fuzz::write_file("input.h5", data, size);
    const curv::H5Reader reader(path);
    walk(reader, "/", 0);
  });
  return curv::fuzz::run_expecting_clean_errors([&] {
    const std::string path = curv::fuzz::write_file("input.h5", data, size);
    curv::Provenance p;
    {
      const curv::H5Reader reader(path);
      p.model = root_string(reader, "model");
      p.dtype = root_string(reader, "dtype");
      p.probe_hash = root_string(reader, "probe_hash");
      p.blocks = root_string(reader, "blocks");
      p.seed = std::strtoll(root_string(reader, "seed").c_str(), nullptr, 10);
    }
    curv::ProbeReport report(path, p, /*resume=*/true);
    (void)report.done("run", 0, "delta");
    (void)report.checkpoint_digest("run", 0);
    (void)report.taylor_table();
  });
}
