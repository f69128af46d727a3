#include "io/h5_detail.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "curv/core/error.h"

namespace curv::h5 {

namespace {

herr_t innermost_error(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err->desc) *out = err->desc;
  return 0;
}

// libhdf5 1.10 parses a global heap collection (the "GCOL" blocks that hold variable-length
// strings) in a loop that never ends when an object header declares index 0 and size 0, or a size
// that wraps the position around, and copies an object's declared size without checking that it
// fits in the collection; a damaged results file would hang --resume or overrun a buffer. Every
// such collection in the file is walked here as libhdf5 walks it (8-byte lengths, the default
// and what every writer we know uses) and FormatError names the file and offset of one that
// would not advance.
void check_global_heaps(const std::string& path, const std::string& context) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(context + "cannot open it: " + std::strerror(errno));
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto le = [&file](size_t at, size_t bytes) {
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(file[at + i])} << (8 * i);
    return v;
  };
  constexpr uint64_t kHeader = 16, kObjectHeader = 16;  // with 8-byte lengths
  for (size_t at = file.find("GCOL"); at != std::string::npos; at = file.find("GCOL", at + 1)) {
    if (file.size() - at < kHeader || file[at + 4] != 1) continue;  // not a version-1 collection
    const uint64_t size = le(at + 8, 8);
    const uint64_t end = size;  // offsets relative to the collection's start
    uint64_t pos = kHeader;
    while (pos < end) {
      if (end - pos < kObjectHeader) break;               // trailing free space
      if (at + pos + kObjectHeader > file.size()) break;  // beyond the file: libhdf5 fails to read
      const uint64_t index = le(at + pos, 2);
      const uint64_t object = le(at + pos + 8, 8);
      const uint64_t aligned = object > UINT64_MAX - 7 ? 0 : (object + 7) / 8 * 8;
      const uint64_t need = index > 0 ? kObjectHeader + aligned : object;
      // An object reaching past its collection: libhdf5 copies `size` bytes from it.
      const bool overruns = index > 0 && object > end - pos - kObjectHeader;
      if (need == 0 || overruns || pos + need <= pos) {
        throw FormatError(
            fmt::format("{}the global heap collection at byte {} is corrupt (object {} at byte {} "
                        "declares size {})",
                        context, at, index, at + pos, object));
      }
      pos += need;
    }
  }
}

herr_t collect_attribute_name(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

}  // namespace

// HDF5 prints its error stack to stderr by default; our exceptions carry the message instead.
// In a thread-safe HDF5 build the setting is per thread, so every entry point calls this.
void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// The innermost HDF5 error message (e.g. the errno text of a failed open), then clears the
// stack; empty when HDF5 recorded nothing.
std::string hdf5_detail() {
  std::string detail;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, &detail);
  H5Eclear2(H5E_DEFAULT);
  return detail.empty() ? std::string() : " (HDF5: " + detail + ")";
}

// Splits "/a//b/" into {"a", "b"}; rejects "." and ".." which HDF5 would resolve specially.
std::vector<std::string> split_path(const std::string& path, const std::string& context) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (part == "." || part == "..") {
      throw InvalidArgument(context + ": object path '" + path + "' contains '" + part + "'");
    }
    if (!part.empty()) parts.push_back(std::move(part));
    start = end + 1;
  }
  return parts;
}

std::string join_path(const std::vector<std::string>& parts, size_t count) {
  if (count == 0) return "/";
  std::string out;
  for (size_t i = 0; i < count; ++i) out += "/" + parts[i];
  return out;
}

std::string normalize(const std::string& path, const std::string& context) {
  auto parts = split_path(path, context);
  return join_path(parts, parts.size());
}

Handle utf8_string_type() {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  return type;
}

std::string dims_text(const std::vector<uint64_t>& dims) {
  std::string out = "{";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "}";
}

Handle file_access_plist() {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 12, 1) || (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7)
  // Network file systems often lack flock(); HDF5 would then refuse to open at all.
  H5Pset_file_locking(fapl.get(), true, true);
#endif
  return fapl;
}

std::string writer_context(const std::string& file) { return "H5Writer for '" + file + "'"; }

std::string reader_where(const std::string& file, const std::string& object) {
  return "HDF5 file '" + file + "': " + object;
}

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER:
      return "integers";
    case H5T_FLOAT:
      return "floats";
    case H5T_STRING:
      return "strings";
    case H5T_COMPOUND:
      return "compound values";
    case H5T_ENUM:
      return "enum values";
    case H5T_ARRAY:
      return "arrays";
    case H5T_VLEN:
      return "variable-length sequences";
    case H5T_REFERENCE:
      return "references";
    default:
      return "values of an unsupported type";
  }
}

// Shape and element count; a scalar dataspace has rank 0 and one element.
size_t extent(const Source& src, std::vector<uint64_t>* dims) {
  Handle space = src.space();
  if (!space.valid()) src.fail("cannot read dataspace");
  hssize_t n = H5Sget_simple_extent_npoints(space.get());
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (n < 0 || rank < 0) src.fail("cannot read dataspace");
  if (dims) {
    std::vector<hsize_t> h(static_cast<size_t>(rank));
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), h.data(), nullptr);
    dims->assign(h.begin(), h.end());
  }
  return static_cast<size_t>(n);
}

std::vector<std::string> read_strings(const Source& src, std::vector<uint64_t>* dims) {
  Handle file_type = src.type();
  H5T_class_t c = H5Tget_class(file_type.get());
  if (c != H5T_STRING) src.fail(std::string("holds ") + class_name(c) + ", expected strings");
  size_t n = extent(src, dims);
  std::vector<std::string> out;
  out.reserve(n);
  if (n == 0) return out;
  if (H5Tis_variable_str(file_type.get()) > 0) {
    Handle mem_type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem_type.get(), H5T_VARIABLE);
    // HDF5 does not convert between character sets, so read in the file's own.
    H5Tset_cset(mem_type.get(), H5Tget_cset(file_type.get()));
    std::vector<char*> pointers(n, nullptr);
    if (!src.read(mem_type.get(), pointers.data())) src.fail("cannot read strings");
    for (char* p : pointers) out.emplace_back(p ? p : "");
    Handle space = src.space();
#if H5_VERSION_GE(1, 12, 0)
    H5Treclaim(mem_type.get(), space.get(), H5P_DEFAULT, pointers.data());
#else
    H5Dvlen_reclaim(mem_type.get(), space.get(), H5P_DEFAULT, pointers.data());
#endif
  } else {
    size_t size = H5Tget_size(file_type.get());
    Handle mem_type(H5Tcopy(file_type.get()), H5Tclose);
    std::vector<char> buffer(n * size);
    if (size > 0 && !src.read(mem_type.get(), buffer.data())) src.fail("cannot read strings");
    bool space_padded = H5Tget_strpad(file_type.get()) == H5T_STR_SPACEPAD;
    for (size_t i = 0; i < n; ++i) {
      const char* begin = buffer.data() + i * size;
      size_t len = strnlen(begin, size);
      if (space_padded) {
        while (len > 0 && begin[len - 1] == ' ') --len;
      }
      out.emplace_back(begin, len);
    }
  }
  return out;
}

// Opens an existing HDF5 file read-only; FormatError naming the path if that is not possible.
Handle open_for_reading(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string context = "cannot read HDF5 file '" + path + "': ";
  std::error_code ec;
  if (!fs::exists(path, ec)) throw FormatError(context + "no such file");
  if (fs::is_directory(path, ec)) throw FormatError(context + "it is a directory");
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    hdf5_detail();  // clears the stack
    throw FormatError(context + "not an HDF5 file");
  }
  check_global_heaps(path, context);
  Handle fapl = file_access_plist();
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.valid()) throw FormatError(context + "cannot open it" + hdf5_detail());
  return file;
}

// The attribute names of an open object, sorted; `where` names it in errors.
std::vector<std::string> attribute_names_of(hid_t object, const std::string& where) {
  std::vector<std::string> names;
  hsize_t index = 0;
  if (H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, &index, collect_attribute_name, &names) < 0) {
    throw FormatError(where + ": cannot list attributes" + hdf5_detail());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace curv::h5
