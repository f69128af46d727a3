// Reading a whole HDF5 file back as --resume and a notebook would: shared by the HDF5 harnesses.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "curv/analysis/report.h"
#include "curv/core/error.h"
#include "curv/io/h5_file.h"

namespace curv::fuzz {

inline void walk(const curv::H5Reader& reader, const std::string& path, int depth) {
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

inline std::string root_string(const curv::H5Reader& reader, const char* key) {
  try {
    if (reader.has_attribute("/", key)) return reader.attribute_string("/", key);
  } catch (const curv::Error&) {
  }
  return "";
}

// Every group, dataset and attribute of `path` through H5Reader, then ProbeReport's resume with
// the provenance the file claims (so its tables and digests are read too).
inline void read_back(const std::string& path) {
  {
    const H5Reader reader(path);
    walk(reader, "/", 0);
  }
  Provenance p;
  {
    const H5Reader reader(path);
    p.model = root_string(reader, "model");
    p.dtype = root_string(reader, "dtype");
    p.probe_hash = root_string(reader, "probe_hash");
    p.blocks = root_string(reader, "blocks");
    p.seed = std::strtoll(root_string(reader, "seed").c_str(), nullptr, 10);
  }
  ProbeReport report(path, p, /*resume=*/true);
  (void)report.done("run", 0, "delta");
  (void)report.checkpoint_digest("run", 0);
}

}  // namespace curv::fuzz
