// HDF5 file layer on the HDF5 C API (simpler than H5Cpp for strings and attributes).
#include "curv/io/h5_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <utility>

#include "curv/core/error.h"

namespace curv {
namespace {

// Datasets above this many elements are chunked and gzip-compressed; smaller ones stay
// contiguous, where compression would not pay for the chunk index.
constexpr size_t kCompressAbove = 4096;
constexpr int kGzipLevel = 4;
// About 512 KB of doubles per chunk: large enough for good compression, small enough that
// h5py reading a slice does not decompress much more than it needs.
constexpr hsize_t kChunkElements = 65536;

// HDF5 prints its error stack to stderr by default; our exceptions carry the message instead.
// In a thread-safe HDF5 build the setting is per thread, so every entry point calls this.
void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

herr_t innermost_error(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err->desc) *out = err->desc;
  return 0;
}

// The innermost HDF5 error message (e.g. the errno text of a failed open), then clears the
// stack; empty when HDF5 recorded nothing.
std::string hdf5_detail() {
  std::string detail;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, &detail);
  H5Eclear2(H5E_DEFAULT);
  return detail.empty() ? std::string() : " (HDF5: " + detail + ")";
}

// Owns an hid_t and closes it with the matching H5?close.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, -1)), close_(other.close_) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      close();
      id_ = std::exchange(other.id_, -1);
      close_ = other.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now and reports whether closing succeeded (for files, where close writes data).
  bool close() {
    hid_t id = std::exchange(id_, -1);
    return id < 0 || close_(id) >= 0;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

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

// Chunk shape for a compressed dataset: shrink the leading dimensions first so that a chunk
// holds about kChunkElements and rows stay whole where possible.
std::vector<hsize_t> chunk_shape(const std::vector<hsize_t>& dims) {
  std::vector<hsize_t> chunk = dims;
  for (size_t i = 0; i < chunk.size(); ++i) {
    hsize_t total = 1;
    for (hsize_t d : chunk) total *= d;
    if (total <= kChunkElements) break;
    hsize_t others = total / chunk[i];
    chunk[i] =
        std::max<hsize_t>(1, std::min(chunk[i], kChunkElements / std::max<hsize_t>(1, others)));
  }
  return chunk;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), O_RDONLY | (directory ? O_DIRECTORY : 0));
  if (fd < 0) {
    throw Error("cannot open '" + path + "' to sync it: " + std::strerror(errno));
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw Error("cannot sync '" + path + "': " + std::strerror(err));
}

Handle file_access_plist() {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 12, 1) || (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7)
  // Network file systems often lack flock(); HDF5 would then refuse to open at all.
  H5Pset_file_locking(fapl.get(), true, true);
#endif
  return fapl;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Table

void Table::add_column(const std::string& name, Column values) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    throw InvalidArgument("Table: invalid column name '" + name + "'");
  }
  if (has_column(name)) throw InvalidArgument("Table: duplicate column '" + name + "'");
  size_t rows = std::visit([](const auto& v) { return v.size(); }, values);
  if (!names_.empty() && rows != num_rows_) {
    throw InvalidArgument("Table: column '" + name + "' has " + std::to_string(rows) +
                          " rows, the table has " + std::to_string(num_rows_));
  }
  names_.push_back(name);
  columns_.push_back(std::move(values));
  num_rows_ = rows;
}

void Table::append_rows(const Table& other) {
  if (names_.empty()) {
    *this = other;
    return;
  }
  if (other.names_ != names_) {
    throw InvalidArgument("Table::append_rows: the column names differ");
  }
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (columns_[i].index() != other.columns_[i].index()) {
      throw InvalidArgument("Table::append_rows: column '" + names_[i] + "' has another type");
    }
  }
  for (size_t i = 0; i < columns_.size(); ++i) {
    std::visit(
        [&](auto& mine) {
          const auto& theirs = std::get<std::decay_t<decltype(mine)>>(other.columns_[i]);
          mine.insert(mine.end(), theirs.begin(), theirs.end());
        },
        columns_[i]);
  }
  num_rows_ += other.num_rows_;
}

bool Table::has_column(const std::string& name) const {
  for (const auto& n : names_) {
    if (n == name) return true;
  }
  return false;
}

size_t Table::index_of(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return i;
  }
  throw InvalidArgument("Table: no column '" + name + "'");
}

const Table::Column& Table::column(const std::string& name) const {
  return columns_[index_of(name)];
}

namespace {
template <typename T>
const std::vector<T>& typed_column(const Table::Column& column, const std::string& name,
                                   const char* type) {
  if (const auto* values = std::get_if<std::vector<T>>(&column)) return *values;
  throw InvalidArgument("Table: column '" + name + "' does not hold " + type);
}
}  // namespace

const std::vector<double>& Table::doubles(const std::string& name) const {
  return typed_column<double>(column(name), name, "doubles");
}
const std::vector<int64_t>& Table::int64s(const std::string& name) const {
  return typed_column<int64_t>(column(name), name, "int64s");
}
const std::vector<std::string>& Table::strings(const std::string& name) const {
  return typed_column<std::string>(column(name), name, "strings");
}

// ---------------------------------------------------------------------------------------------
// H5Writer

namespace {
using AttributeValue =
    std::variant<double, int64_t, std::string, std::vector<double>, std::vector<std::string>>;
}

namespace detail {
struct H5Node {
  bool is_dataset = false;
  std::map<std::string, std::unique_ptr<H5Node>> children;  // groups only
  std::map<std::string, AttributeValue> attributes;
  Table::Column data;          // datasets only
  std::vector<uint64_t> dims;  // datasets only
};
}  // namespace detail

namespace {

using Node = detail::H5Node;

std::string writer_context(const std::string& file) { return "H5Writer for '" + file + "'"; }

// Walks to the node at `parts[0..count)`, creating missing groups.
Node& walk_to(Node& root, const std::vector<std::string>& parts, size_t count,
              const std::string& file) {
  Node* node = &root;
  for (size_t i = 0; i < count; ++i) {
    if (node->is_dataset) {
      throw InvalidArgument(writer_context(file) + ": " + join_path(parts, i) +
                            " is a dataset, cannot hold " + join_path(parts, parts.size()));
    }
    auto& child = node->children[parts[i]];
    if (!child) child = std::make_unique<Node>();
    node = child.get();
  }
  return *node;
}

void set_dataset(Node& root, const std::string& path, Table::Column data,
                 std::vector<uint64_t> dims, const std::string& file) {
  const std::string context = writer_context(file);
  auto parts = split_path(path, context);
  const std::string where = context + ": dataset " + join_path(parts, parts.size());
  if (parts.empty()) throw InvalidArgument(context + ": the root '/' cannot be a dataset");
  size_t n = std::visit([](const auto& v) { return v.size(); }, data);
  if (dims.empty()) dims = {n};
  uint64_t product = 1;
  for (uint64_t d : dims) product *= d;
  if (product != n) {
    throw InvalidArgument(where + ": data has " + std::to_string(n) + " elements but dims " +
                          dims_text(dims) + " hold " + std::to_string(product));
  }
  Node& parent = walk_to(root, parts, parts.size() - 1, file);
  if (parent.is_dataset) {
    throw InvalidArgument(where + ": " + join_path(parts, parts.size() - 1) + " is a dataset");
  }
  auto& node = parent.children[parts.back()];
  if (node && !node->is_dataset && (!node->children.empty() || !node->attributes.empty())) {
    throw InvalidArgument(where + ": already declared as a group");
  }
  if (!node) node = std::make_unique<Node>();
  node->is_dataset = true;
  node->children.clear();
  node->data = std::move(data);
  node->dims = std::move(dims);
}

void set_attribute(Node& root, const std::string& object_path, const std::string& name,
                   AttributeValue value, const std::string& file) {
  const std::string context = writer_context(file);
  auto parts = split_path(object_path, context);
  if (name.empty()) {
    throw InvalidArgument(context + ": empty attribute name on " + join_path(parts, parts.size()));
  }
  walk_to(root, parts, parts.size(), file).attributes[name] = std::move(value);
}

// --- writing the description to an open file ---

struct WriteContext {
  const std::string& file;  // the final path, named in messages
  std::string fail(const std::string& object, const std::string& what) const {
    return "cannot write HDF5 file '" + file + "': " + object + ": " + what + hdf5_detail();
  }
};

Handle simple_space(const std::vector<uint64_t>& dims) {
  std::vector<hsize_t> h(dims.begin(), dims.end());
  return Handle(H5Screate_simple(static_cast<int>(h.size()), h.data(), nullptr), H5Sclose);
}

void write_attribute(hid_t object, const std::string& object_path, const std::string& name,
                     const AttributeValue& value, const WriteContext& ctx) {
  const std::string where = object_path + " attribute '" + name + "'";
  Handle type(-1, H5Tclose);
  hid_t file_type = -1, mem_type = -1;
  Handle space(-1, H5Sclose);
  std::vector<const char*> pointers;
  const void* buffer = nullptr;
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, double>) {
          file_type = H5T_IEEE_F64LE, mem_type = H5T_NATIVE_DOUBLE, buffer = &v;
          space = Handle(H5Screate(H5S_SCALAR), H5Sclose);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          file_type = H5T_STD_I64LE, mem_type = H5T_NATIVE_INT64, buffer = &v;
          space = Handle(H5Screate(H5S_SCALAR), H5Sclose);
        } else if constexpr (std::is_same_v<T, std::string>) {
          type = utf8_string_type();
          file_type = mem_type = type.get();
          pointers = {v.c_str()};
          buffer = pointers.data();
          space = Handle(H5Screate(H5S_SCALAR), H5Sclose);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          file_type = H5T_IEEE_F64LE, mem_type = H5T_NATIVE_DOUBLE, buffer = v.data();
          space = simple_space({v.size()});
        } else {
          type = utf8_string_type();
          file_type = mem_type = type.get();
          for (const auto& s : v) pointers.push_back(s.c_str());
          buffer = pointers.data();
          space = simple_space({v.size()});
        }
      },
      value);
  if (!space.valid()) throw Error(ctx.fail(where, "cannot create dataspace"));
  Handle attr(H5Acreate2(object, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose);
  if (!attr.valid()) throw Error(ctx.fail(where, "cannot create attribute"));
  if (H5Sget_simple_extent_npoints(space.get()) > 0 && H5Awrite(attr.get(), mem_type, buffer) < 0) {
    throw Error(ctx.fail(where, "cannot write attribute"));
  }
}

void write_attributes(hid_t object, const std::string& object_path, const Node& node,
                      const WriteContext& ctx) {
  for (const auto& [name, value] : node.attributes) {
    write_attribute(object, object_path, name, value, ctx);
  }
}

void write_dataset(hid_t parent, const std::string& name, const std::string& path, const Node& node,
                   const WriteContext& ctx) {
  Handle string_type(-1, H5Tclose);
  hid_t file_type = -1, mem_type = -1;
  std::vector<const char*> pointers;
  const void* buffer = nullptr;
  size_t n = 0;
  bool numeric = true;
  std::visit(
      [&](const auto& v) {
        using T = typename std::decay_t<decltype(v)>::value_type;
        n = v.size();
        if constexpr (std::is_same_v<T, double>) {
          file_type = H5T_IEEE_F64LE, mem_type = H5T_NATIVE_DOUBLE, buffer = v.data();
        } else if constexpr (std::is_same_v<T, int64_t>) {
          file_type = H5T_STD_I64LE, mem_type = H5T_NATIVE_INT64, buffer = v.data();
        } else {
          string_type = utf8_string_type();
          file_type = mem_type = string_type.get();
          for (const auto& s : v) pointers.push_back(s.c_str());
          buffer = pointers.data();
          numeric = false;
        }
      },
      node.data);
  const std::string where = "dataset " + path;
  // Empty dims only come from H5Writer::load of a scalar dataset.
  Handle space =
      node.dims.empty() ? Handle(H5Screate(H5S_SCALAR), H5Sclose) : simple_space(node.dims);
  if (!space.valid()) throw Error(ctx.fail(where, "cannot create dataspace"));
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (n > kCompressAbove) {
    auto chunk = chunk_shape(std::vector<hsize_t>(node.dims.begin(), node.dims.end()));
    bool ok = H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) >= 0;
    // Byte shuffling groups exponent bytes together, which gzip compresses far better.
    if (ok && numeric) ok = H5Pset_shuffle(dcpl.get()) >= 0;
    if (ok) ok = H5Pset_deflate(dcpl.get(), kGzipLevel) >= 0;
    if (!ok) throw Error(ctx.fail(where, "cannot set up chunked gzip storage"));
  }
  Handle dset(H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(),
                         H5P_DEFAULT),
              H5Dclose);
  if (!dset.valid()) throw Error(ctx.fail(where, "cannot create dataset"));
  // An empty dataset has nothing to write, and HDF5 rejects a null buffer.
  if (n > 0 && H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer) < 0) {
    throw Error(ctx.fail(where, "cannot write data"));
  }
  write_attributes(dset.get(), path, node, ctx);
}

void write_group(hid_t group, const std::string& path, const Node& node, const WriteContext& ctx) {
  write_attributes(group, path, node, ctx);
  for (const auto& [name, child] : node.children) {
    const std::string child_path = (path == "/" ? "" : path) + "/" + name;
    if (child->is_dataset) {
      write_dataset(group, name, child_path, *child, ctx);
    } else {
      Handle sub(H5Gcreate2(group, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      if (!sub.valid()) throw Error(ctx.fail("group " + child_path, "cannot create group"));
      write_group(sub.get(), child_path, *child, ctx);
    }
  }
}

// Bob Jenkins' lookup3 hash (hashlittle, initial value 0): the checksum HDF5 puts on its
// version 2 and later metadata.
uint32_t lookup3(const unsigned char* k, size_t length) {
  auto rot = [](uint32_t x, int r) { return (x << r) | (x >> (32 - r)); };
  uint32_t a, b, c;
  a = b = c = 0xdeadbeefu + static_cast<uint32_t>(length);
  auto word = [&](size_t i, size_t n) {  // n little-endian bytes from k + i
    uint32_t w = 0;
    for (size_t j = 0; j < n; ++j) w |= static_cast<uint32_t>(k[i + j]) << (8 * j);
    return w;
  };
  while (length > 12) {
    a += word(0, 4), b += word(4, 4), c += word(8, 4);
    a -= c, a ^= rot(c, 4), c += b;
    b -= a, b ^= rot(a, 6), a += c;
    c -= b, c ^= rot(b, 8), b += a;
    a -= c, a ^= rot(c, 16), c += b;
    b -= a, b ^= rot(a, 19), a += c;
    c -= b, c ^= rot(b, 4), b += a;
    length -= 12, k += 12;
  }
  if (length == 0) return c;
  a += word(0, std::min<size_t>(length, 4));
  if (length > 4) b += word(4, std::min<size_t>(length - 4, 4));
  if (length > 8) c += word(8, length - 8);
  c ^= b, c -= rot(b, 14);
  a ^= c, a -= rot(c, 11);
  b ^= a, b -= rot(a, 25);
  c ^= b, c -= rot(b, 16);
  a ^= c, a -= rot(c, 4);
  b ^= a, b -= rot(a, 14);
  c ^= b, c -= rot(b, 24);
  return c;
}

// HDF5 1.10's H5Fget_file_image clears the superblock's "file open for writing" flags in the copy
// but keeps the checksum computed with them set, so a version 2 or 3 superblock in the image
// fails its checksum when read. Recomputes it. The old checksum must match the image with some
// flags value, which also checks this hash against HDF5's own.
void repair_superblock_checksum(std::vector<char>& image, const WriteContext& ctx) {
  auto* bytes = reinterpret_cast<unsigned char*>(image.data());
  constexpr size_t kVersion = 8, kOffsetSize = 9, kFlags = 11, kAddresses = 12;
  if (image.size() < kAddresses || bytes[kVersion] < 2) return;  // no checksum before version 2
  const size_t checksum_at = kAddresses + 4 * size_t{bytes[kOffsetSize]};
  if (image.size() < checksum_at + 4) {
    throw Error(ctx.fail("file image", "superblock cut short"));
  }
  uint32_t stored = 0;
  for (int j = 0; j < 4; ++j) stored |= static_cast<uint32_t>(bytes[checksum_at + j]) << (8 * j);
  const unsigned char flags = bytes[kFlags];
  bool known = false;
  for (int f = 0; f < 256 && !known; ++f) {
    bytes[kFlags] = static_cast<unsigned char>(f);
    known = lookup3(bytes, checksum_at) == stored;
  }
  bytes[kFlags] = flags;
  if (!known) throw Error(ctx.fail("file image", "superblock checksum does not match"));
  const uint32_t fixed = lookup3(bytes, checksum_at);
  for (int j = 0; j < 4; ++j) bytes[checksum_at + j] = static_cast<unsigned char>(fixed >> (8 * j));
}

// Builds the whole file in memory (HDF5's core driver, no backing store) and returns its bytes.
// Writing to disk is then ours alone: a failed write (a full disk, a file size limit) leaves no
// HDF5 file half-open, which HDF5 would otherwise try to flush again at exit and crash on.
std::vector<char> file_image(const std::string& tmp, const Node& root, const WriteContext& ctx) {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  constexpr size_t kImageIncrement = size_t{1} << 20;
  if (!fapl.valid() || H5Pset_fapl_core(fapl.get(), kImageIncrement, false) < 0) {
    throw Error(ctx.fail("file image", "cannot set up HDF5's in-memory driver"));
  }
  // The 1.8 object-header format stores attributes over 64 KB (long column lists) densely;
  // every HDF5 since 1.8 and h5py read it.
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
  // Fail the close if an object were still open, rather than silently keeping it open.
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_SEMI);
  Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!file.valid()) throw Error(ctx.fail("file image", "cannot create it"));
  {
    Handle root_group(H5Gopen2(file.get(), "/", H5P_DEFAULT), H5Gclose);
    if (!root_group.valid()) throw Error(ctx.fail("group /", "cannot open root group"));
    write_group(root_group.get(), "/", root, ctx);
  }
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) {
    throw Error(ctx.fail("file image", "cannot flush it"));
  }
  const ssize_t size = H5Fget_file_image(file.get(), nullptr, 0);
  if (size < 0) throw Error(ctx.fail("file image", "cannot measure it"));
  std::vector<char> image(static_cast<size_t>(size));
  if (H5Fget_file_image(file.get(), image.data(), image.size()) != size || !file.close()) {
    throw Error(ctx.fail("file image", "cannot copy it out of HDF5"));
  }
  repair_superblock_checksum(image, ctx);
  return image;
}

// Writes the bytes to a new file and syncs them to disk; every failure names the file and errno.
void write_synced(const std::string& path, const std::vector<char>& bytes,
                  const std::string& context) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw Error(context + ": cannot create temporary file '" + path + "': " + std::strerror(errno));
  }
  size_t done = 0;
  int err = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  const char* step = "writing";
  if (err == 0 && ::fsync(fd) != 0) err = errno, step = "syncing";
  if (::close(fd) != 0 && err == 0) err = errno, step = "closing";
  if (err != 0) {
    throw Error(context + ": " + step + " temporary file '" + path + "' failed after " +
                std::to_string(done) + " of " + std::to_string(bytes.size()) +
                " bytes: " + std::strerror(err));
  }
}

}  // namespace

H5Writer::H5Writer(std::string path) : path_(std::move(path)), root_(std::make_unique<Node>()) {}
H5Writer::~H5Writer() = default;
H5Writer::H5Writer(H5Writer&&) noexcept = default;
H5Writer& H5Writer::operator=(H5Writer&&) noexcept = default;

void H5Writer::group(const std::string& path) {
  auto parts = split_path(path, writer_context(path_));
  Node& node = walk_to(*root_, parts, parts.size(), path_);
  if (node.is_dataset) {
    throw InvalidArgument(writer_context(path_) + ": " + join_path(parts, parts.size()) +
                          " is already a dataset");
  }
}

void H5Writer::dataset(const std::string& path, std::vector<double> data,
                       std::vector<uint64_t> dims) {
  set_dataset(*root_, path, std::move(data), std::move(dims), path_);
}

void H5Writer::dataset(const std::string& path, std::vector<int64_t> data,
                       std::vector<uint64_t> dims) {
  set_dataset(*root_, path, std::move(data), std::move(dims), path_);
}

void H5Writer::dataset(const std::string& path, std::vector<std::string> data) {
  set_dataset(*root_, path, std::move(data), {}, path_);
}

void H5Writer::attribute(const std::string& object_path, const std::string& name, double value) {
  set_attribute(*root_, object_path, name, value, path_);
}

void H5Writer::attribute_int64(const std::string& object_path, const std::string& name,
                               int64_t value) {
  set_attribute(*root_, object_path, name, value, path_);
}

void H5Writer::attribute(const std::string& object_path, const std::string& name,
                         std::string value) {
  set_attribute(*root_, object_path, name, std::move(value), path_);
}

void H5Writer::attribute(const std::string& object_path, const std::string& name,
                         std::vector<double> value) {
  set_attribute(*root_, object_path, name, std::move(value), path_);
}

void H5Writer::attribute(const std::string& object_path, const std::string& name,
                         std::vector<std::string> value) {
  set_attribute(*root_, object_path, name, std::move(value), path_);
}

void H5Writer::table(const std::string& group_path, const Table& table) {
  const std::string context = writer_context(path_);
  auto parts = split_path(group_path, context);
  Node& node = walk_to(*root_, parts, parts.size(), path_);
  if (node.is_dataset) {
    throw InvalidArgument(context + ": table group " + join_path(parts, parts.size()) +
                          " is already a dataset");
  }
  node.children.clear();
  const std::string base = join_path(parts, parts.size());
  for (const auto& name : table.names()) {
    set_dataset(*root_, (base == "/" ? "" : base) + "/" + name, table.column(name), {}, path_);
  }
  node.attributes["columns"] = table.names();
}

void H5Writer::commit() {
  namespace fs = std::filesystem;
  quiet_hdf5();
  const std::string tmp = path_ + ".tmp";
  fs::path directory = fs::path(path_).parent_path();
  if (directory.empty()) directory = ".";
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) {
    throw Error("cannot write HDF5 file '" + path_ + "': directory '" + directory.string() +
                "' does not exist");
  }
  WriteContext ctx{path_};
  try {
    write_synced(tmp, file_image(tmp, *root_, ctx), "cannot write HDF5 file '" + path_ + "'");
    if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
      throw Error("cannot write HDF5 file '" + path_ + "': renaming '" + tmp +
                  "' over it failed: " + std::strerror(errno));
    }
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  // Makes the rename itself durable. The new file is already in place, and some file systems
  // cannot sync a directory, so a failure here is not worth failing the commit.
  try {
    fsync_path(directory.string(), true);
  } catch (const Error&) {
  }
}

// ---------------------------------------------------------------------------------------------
// H5Reader

struct H5Reader::File {
  Handle id{-1, H5Fclose};
};

namespace {

// A dataset or an attribute: both are read the same way once opened.
struct Source {
  Handle handle;
  bool is_attribute;
  std::string where;  // "HDF5 file 'f.h5': /a/b" or "... /a/b attribute 'x'"

  Handle type() const {
    return Handle(is_attribute ? H5Aget_type(handle.get()) : H5Dget_type(handle.get()), H5Tclose);
  }
  Handle space() const {
    return Handle(is_attribute ? H5Aget_space(handle.get()) : H5Dget_space(handle.get()), H5Sclose);
  }
  bool read(hid_t mem_type, void* buffer) const {
    return (is_attribute
                ? H5Aread(handle.get(), mem_type, buffer)
                : H5Dread(handle.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer)) >= 0;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(where + ": " + what + hdf5_detail());
  }
};

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

template <typename T>
std::vector<T> read_numbers(const Source& src, hid_t mem_type, bool allow_float,
                            std::vector<uint64_t>* dims) {
  Handle type = src.type();
  H5T_class_t c = H5Tget_class(type.get());
  if (!(c == H5T_INTEGER || (allow_float && c == H5T_FLOAT))) {
    src.fail(std::string("holds ") + class_name(c) + ", expected " +
             (allow_float ? "numbers" : "integers"));
  }
  std::vector<T> out(extent(src, dims));
  if (!out.empty() && !src.read(mem_type, out.data())) src.fail("cannot read values");
  return out;
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

herr_t collect_attribute_name(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
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

}  // namespace

H5Reader::H5Reader(const std::string& path) : path_(path), file_(std::make_unique<File>()) {
  quiet_hdf5();
  file_->id = open_for_reading(path);
}

H5Reader::~H5Reader() = default;
H5Reader::H5Reader(H5Reader&&) noexcept = default;
H5Reader& H5Reader::operator=(H5Reader&&) noexcept = default;

namespace {

// The HDF5 object type at `path`, or H5I_BADID when there is none. H5Lexists needs every
// intermediate link to exist, so each prefix is checked in turn.
H5I_type_t object_type(hid_t file, const std::string& path) {
  auto parts = split_path(path, "H5Reader");
  for (size_t i = 1; i <= parts.size(); ++i) {
    if (H5Lexists(file, join_path(parts, i).c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return H5I_BADID;
    }
  }
  Handle object(H5Oopen(file, join_path(parts, parts.size()).c_str(), H5P_DEFAULT), H5Oclose);
  if (!object.valid()) {  // e.g. a dangling soft link
    H5Eclear2(H5E_DEFAULT);
    return H5I_BADID;
  }
  return H5Iget_type(object.get());
}

std::string reader_where(const std::string& file, const std::string& object) {
  return "HDF5 file '" + file + "': " + object;
}

Source open_dataset(hid_t file, const std::string& file_path, const std::string& path) {
  const std::string norm = normalize(path, "H5Reader for '" + file_path + "'");
  const std::string where = reader_where(file_path, "dataset " + norm);
  H5I_type_t type = object_type(file, norm);
  if (type == H5I_BADID) throw FormatError(where + ": no such dataset");
  if (type != H5I_DATASET) throw FormatError(where + ": is a group, not a dataset");
  Source src{Handle(H5Dopen2(file, norm.c_str(), H5P_DEFAULT), H5Dclose), false, where};
  if (!src.handle.valid()) src.fail("cannot open dataset");
  return src;
}

Source open_attribute(hid_t file, const std::string& file_path, const std::string& object_path,
                      const std::string& name) {
  const std::string norm = normalize(object_path, "H5Reader for '" + file_path + "'");
  const std::string where = reader_where(file_path, norm + " attribute '" + name + "'");
  if (object_type(file, norm) == H5I_BADID) throw FormatError(where + ": no such object");
  if (H5Aexists_by_name(file, norm.c_str(), name.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw FormatError(where + ": no such attribute");
  }
  Source src{
      Handle(H5Aopen_by_name(file, norm.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose),
      true, where};
  if (!src.handle.valid()) src.fail("cannot open attribute");
  return src;
}

template <typename T>
T single(std::vector<T> values, const Source& src) {
  if (values.size() != 1) {
    src.fail("has " + std::to_string(values.size()) + " elements, expected one");
  }
  return std::move(values[0]);
}

}  // namespace

bool H5Reader::exists(const std::string& path) const {
  quiet_hdf5();
  return object_type(file_->id.get(), path) != H5I_BADID;
}

bool H5Reader::is_group(const std::string& path) const {
  quiet_hdf5();
  return object_type(file_->id.get(), path) == H5I_GROUP;
}

bool H5Reader::is_dataset(const std::string& path) const {
  quiet_hdf5();
  return object_type(file_->id.get(), path) == H5I_DATASET;
}

std::vector<std::string> H5Reader::children(const std::string& group) const {
  quiet_hdf5();
  const std::string norm = normalize(group, "H5Reader for '" + path_ + "'");
  const std::string where = reader_where(path_, "group " + norm);
  H5I_type_t type = object_type(file_->id.get(), norm);
  if (type == H5I_BADID) throw FormatError(where + ": no such group");
  if (type != H5I_GROUP) throw FormatError(where + ": is a dataset, not a group");
  Handle g(H5Gopen2(file_->id.get(), norm.c_str(), H5P_DEFAULT), H5Gclose);
  H5G_info_t info;
  if (!g.valid() || H5Gget_info(g.get(), &info) < 0) {
    throw FormatError(where + ": cannot open group" + hdf5_detail());
  }
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t len =
        H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) throw FormatError(where + ": cannot list members" + hdf5_detail());
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                       H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    names.push_back(std::move(name));
  }
  // The name index is already ordered; sorting again pins the order to plain byte order.
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<double> H5Reader::doubles(const std::string& path, std::vector<uint64_t>* dims) const {
  quiet_hdf5();
  return read_numbers<double>(open_dataset(file_->id.get(), path_, path), H5T_NATIVE_DOUBLE, true,
                              dims);
}

std::vector<int64_t> H5Reader::int64s(const std::string& path, std::vector<uint64_t>* dims) const {
  quiet_hdf5();
  return read_numbers<int64_t>(open_dataset(file_->id.get(), path_, path), H5T_NATIVE_INT64, false,
                               dims);
}

std::vector<std::string> H5Reader::strings(const std::string& path) const {
  quiet_hdf5();
  return read_strings(open_dataset(file_->id.get(), path_, path), nullptr);
}

std::vector<std::string> H5Reader::attribute_names(const std::string& object_path) const {
  quiet_hdf5();
  const std::string norm = normalize(object_path, "H5Reader for '" + path_ + "'");
  const std::string where = reader_where(path_, norm);
  if (object_type(file_->id.get(), norm) == H5I_BADID) {
    throw FormatError(where + ": no such object");
  }
  Handle object(H5Oopen(file_->id.get(), norm.c_str(), H5P_DEFAULT), H5Oclose);
  if (!object.valid()) throw FormatError(where + ": cannot open object" + hdf5_detail());
  return attribute_names_of(object.get(), where);
}

bool H5Reader::has_attribute(const std::string& object_path, const std::string& name) const {
  quiet_hdf5();
  const std::string norm = normalize(object_path, "H5Reader for '" + path_ + "'");
  if (object_type(file_->id.get(), norm) == H5I_BADID) return false;
  htri_t found = H5Aexists_by_name(file_->id.get(), norm.c_str(), name.c_str(), H5P_DEFAULT);
  if (found < 0) H5Eclear2(H5E_DEFAULT);
  return found > 0;
}

double H5Reader::attribute_double(const std::string& object_path, const std::string& name) const {
  quiet_hdf5();
  Source src = open_attribute(file_->id.get(), path_, object_path, name);
  return single(read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr), src);
}

int64_t H5Reader::attribute_int(const std::string& object_path, const std::string& name) const {
  quiet_hdf5();
  Source src = open_attribute(file_->id.get(), path_, object_path, name);
  return single(read_numbers<int64_t>(src, H5T_NATIVE_INT64, false, nullptr), src);
}

std::string H5Reader::attribute_string(const std::string& object_path,
                                       const std::string& name) const {
  quiet_hdf5();
  Source src = open_attribute(file_->id.get(), path_, object_path, name);
  return single(read_strings(src, nullptr), src);
}

std::vector<double> H5Reader::attribute_doubles(const std::string& object_path,
                                                const std::string& name) const {
  quiet_hdf5();
  Source src = open_attribute(file_->id.get(), path_, object_path, name);
  return read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr);
}

std::vector<std::string> H5Reader::attribute_strings(const std::string& object_path,
                                                     const std::string& name) const {
  quiet_hdf5();
  Source src = open_attribute(file_->id.get(), path_, object_path, name);
  return read_strings(src, nullptr);
}

Table H5Reader::table(const std::string& group_path) const {
  quiet_hdf5();
  const std::string norm = normalize(group_path, "H5Reader for '" + path_ + "'");
  Table table;
  for (const auto& name : attribute_strings(norm, "columns")) {
    const std::string column_path = (norm == "/" ? "" : norm) + "/" + name;
    Source src = open_dataset(file_->id.get(), path_, column_path);
    Handle type = src.type();
    H5T_class_t c = H5Tget_class(type.get());
    Table::Column column;
    if (c == H5T_INTEGER) {
      column = read_numbers<int64_t>(src, H5T_NATIVE_INT64, false, nullptr);
    } else if (c == H5T_FLOAT) {
      column = read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr);
    } else if (c == H5T_STRING) {
      column = read_strings(src, nullptr);
    } else {
      src.fail(std::string("table column holds ") + class_name(c));
    }
    try {
      table.add_column(name, std::move(column));
    } catch (const InvalidArgument& e) {
      throw FormatError(reader_where(path_, "table " + norm) + ": " + e.what());
    }
  }
  return table;
}

// ---------------------------------------------------------------------------------------------
// H5Writer::load and editing the description

namespace {

// Fails unless the object has a scalar or simple dataspace of rank at most `max_rank`.
void check_space(const Source& src, int max_rank) {
  Handle space = src.space();
  if (!space.valid()) src.fail("cannot read dataspace");
  if (H5Sget_simple_extent_type(space.get()) == H5S_NULL) {
    src.fail("has a null dataspace, which H5Writer cannot write");
  }
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) src.fail("cannot read dataspace");
  if (rank > max_rank) {
    src.fail("has rank " + std::to_string(rank) + ", H5Writer writes attributes of rank 0 or 1");
  }
}

[[noreturn]] void unsupported_type(const Source& src, H5T_class_t c) {
  src.fail(std::string("holds ") + class_name(c) + ", which H5Writer cannot write");
}

AttributeValue load_attribute(hid_t object, const std::string& object_path, const std::string& name,
                              const std::string& file) {
  Source src{Handle(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose), true,
             reader_where(file, object_path + " attribute '" + name + "'")};
  if (!src.handle.valid()) src.fail("cannot open attribute");
  check_space(src, 1);
  std::vector<uint64_t> dims;
  extent(src, &dims);
  const bool scalar = dims.empty();
  Handle type = src.type();
  H5T_class_t c = H5Tget_class(type.get());
  switch (c) {
    case H5T_INTEGER:
      if (scalar) return single(read_numbers<int64_t>(src, H5T_NATIVE_INT64, false, nullptr), src);
      return read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr);
    case H5T_FLOAT:
      if (scalar) return single(read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr), src);
      return read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr);
    case H5T_STRING:
      if (scalar) return single(read_strings(src, nullptr), src);
      return read_strings(src, nullptr);
    default:
      unsupported_type(src, c);
  }
}

void load_attributes(hid_t object, const std::string& object_path, Node& node,
                     const std::string& file) {
  for (const auto& name : attribute_names_of(object, reader_where(file, object_path))) {
    node.attributes[name] = load_attribute(object, object_path, name, file);
  }
}

void load_dataset(Handle dataset, const std::string& path, Node& node, const std::string& file) {
  Source src{std::move(dataset), false, reader_where(file, "dataset " + path)};
  check_space(src, H5S_MAX_RANK);
  Handle type = src.type();
  H5T_class_t c = H5Tget_class(type.get());
  node.is_dataset = true;
  if (c == H5T_INTEGER) {
    node.data = read_numbers<int64_t>(src, H5T_NATIVE_INT64, false, &node.dims);
  } else if (c == H5T_FLOAT) {
    node.data = read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, &node.dims);
  } else if (c == H5T_STRING) {
    node.data = read_strings(src, &node.dims);
  } else {
    unsupported_type(src, c);
  }
  load_attributes(src.handle.get(), path, node, file);
}

struct Link {
  std::string name;
  H5L_type_t type;
};

herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* data) {
  static_cast<std::vector<Link>*>(data)->push_back({name, info->type});
  return 0;
}

void load_group(hid_t group, const std::string& path, Node& node, const std::string& file) {
  load_attributes(group, path, node, file);
  std::vector<Link> links;
  hsize_t index = 0;
  if (H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &index, collect_link, &links) < 0) {
    throw FormatError(reader_where(file, "group " + path) + ": cannot list members" +
                      hdf5_detail());
  }
  for (const auto& link : links) {
    const std::string child_path = (path == "/" ? "" : path) + "/" + link.name;
    const std::string where = reader_where(file, child_path);
    if (link.type != H5L_TYPE_HARD) {
      throw FormatError(where + ": is a soft or external link, which H5Writer cannot write");
    }
    Handle object(H5Oopen(group, link.name.c_str(), H5P_DEFAULT), H5Oclose);
    if (!object.valid()) throw FormatError(where + ": cannot open object" + hdf5_detail());
    auto& child = node.children[link.name];
    child = std::make_unique<Node>();
    switch (H5Iget_type(object.get())) {
      case H5I_GROUP:
        load_group(object.get(), child_path, *child, file);
        break;
      case H5I_DATASET:
        load_dataset(std::move(object), child_path, *child, file);
        break;
      default:
        throw FormatError(where + ": is a named datatype or another object H5Writer cannot write");
    }
  }
}

}  // namespace

H5Writer H5Writer::load(const std::string& path) {
  quiet_hdf5();
  Handle file = open_for_reading(path);
  Handle root(H5Gopen2(file.get(), "/", H5P_DEFAULT), H5Gclose);
  if (!root.valid()) {
    throw FormatError(reader_where(path, "group /") + ": cannot open it" + hdf5_detail());
  }
  H5Writer writer(path);
  load_group(root.get(), "/", *writer.root_, path);
  return writer;
}

bool H5Writer::exists(const std::string& path) const {
  const Node* node = root_.get();
  for (const auto& part : split_path(path, writer_context(path_))) {
    auto it = node->children.find(part);  // a dataset has no children
    if (it == node->children.end()) return false;
    node = it->second.get();
  }
  return true;
}

void H5Writer::remove(const std::string& path) {
  auto parts = split_path(path, writer_context(path_));
  if (parts.empty()) {
    root_ = std::make_unique<Node>();
    return;
  }
  Node* node = root_.get();
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto it = node->children.find(parts[i]);
    if (it == node->children.end()) return;
    node = it->second.get();
  }
  node->children.erase(parts.back());
}

}  // namespace curv
