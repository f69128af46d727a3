#include "fuzz_support.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace fs = std::filesystem;

namespace curv::fuzz {

namespace {

struct Scratch {
  std::string dir;
  Scratch() {
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    dir = (base / ("curv_fuzz_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

Scratch& scratch() {
  static Scratch s;
  return s;
}

}  // namespace

const std::string& scratch_dir() { return scratch().dir; }

void clear_scratch() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(scratch_dir(), ec)) fs::remove_all(entry, ec);
}

std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  const fs::path path = fs::path(scratch_dir()) / name;
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) std::abort();  // the scratch folder must be writable, or nothing is being tested
  return path.string();
}

std::string write_file(const std::string& name, std::string_view bytes) {
  return write_file(name, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

std::vector<std::string_view> split(const uint8_t* data, size_t size, std::string_view separator,
                                    size_t parts) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> out;
  while (out.size() + 1 < parts) {
    const size_t at = rest.find(separator);
    if (at == std::string_view::npos) break;
    out.push_back(rest.substr(0, at));
    rest.remove_prefix(at + separator.size());
  }
  out.push_back(rest);
  out.resize(parts);
  return out;
}

}  // namespace curv::fuzz
