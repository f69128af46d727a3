// H5Writer: an HDF5 file described in memory and written whole, atomically, on commit().
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "curv/core/error.h"
#include "io/h5_detail.h"

namespace curv {

using namespace h5;

namespace {

// Datasets above this many elements are chunked and gzip-compressed; smaller ones stay
// contiguous, where compression would not pay for the chunk index.
constexpr size_t kCompressAbove = 4096;
constexpr int kGzipLevel = 4;
// About 512 KB of doubles per chunk: large enough for good compression, small enough that
// h5py reading a slice does not decompress much more than it needs.
constexpr hsize_t kChunkElements = 65536;

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
