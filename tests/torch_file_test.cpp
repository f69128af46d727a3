#include "curv/io/torch_file.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "curv/core/error.h"
#include "curv/io/safetensors.h"
#include "test_support.h"
#include "torch_fixtures.h"

using namespace curv;
using Catch::Matchers::Contains;
using Kind = PyValue::Kind;

namespace curv_test {

const std::string& torch_fixtures() {
  static std::unique_ptr<TempDir> dir;
  if (!dir) {
    dir = std::make_unique<TempDir>();
    run_python("make_torch_fixtures.py", {dir->path()});
  }
  return dir->path();
}

}  // namespace curv_test

TEST_CASE("torch.save files: every storage dtype, views, shared storages, containers",
          "[torch_file]") {
  const std::string dir = curv_test::torch_fixtures() + "/reader";
  const auto root = load_torch_file(dir + "/values.pt");
  REQUIRE(root->is(Kind::kDict));
  const PyValue* tensors = root->find("tensors");
  REQUIRE(tensors);
  REQUIRE(tensors->is(Kind::kDict));
  SafetensorsReader expected(dir + "/expected.safetensors");
  REQUIRE(tensors->entries.size() == expected.names().size());
  for (const auto& [key, value] : tensors->entries) {
    INFO(key->text);
    REQUIRE(value->is(Kind::kTensor));
    const at::Tensor want = expected.tensor(key->text);
    CHECK(value->tensor.scalar_type() == want.scalar_type());
    CHECK(value->tensor.sizes() == want.sizes());
    CHECK(value->tensor.is_contiguous());
    CHECK(at::equal(value->tensor, want));
  }
  // Views of one storage (base of 24): shared_t = base.view(4, 6).t(), so shared_t[j][i] is
  // base[6i + j]; shared_slice = base[2:8]; shared_elem = base[17].
  const auto& t = tensors->find("shared_t")->tensor;
  const auto& slice = tensors->find("shared_slice")->tensor;
  CHECK(t.sizes() == at::IntArrayRef({6, 4}));
  CHECK(slice[0][0].item<double>() == t[2][0].item<double>());
  CHECK(slice[1][2].item<double>() == t[1][1].item<double>());
  CHECK(tensors->find("shared_elem")->tensor.item<double>() == t[5][2].item<double>());
  CHECK(tensors->find("shared_elem")->tensor.dim() == 0);

  const PyValue* ints = root->find("ints");
  REQUIRE(ints);
  REQUIRE(ints->items.size() == 4);
  CHECK(ints->items[0]->integer == 1);
  CHECK(ints->items[1]->integer == -2);
  CHECK(ints->items[2]->integer == (int64_t{1} << 40));
  CHECK(ints->items[3]->integer == -(int64_t{1} << 62));
  CHECK(root->find("float")->real == 0.1);
  CHECK(root->find("text")->text == "\xc3\xbcn\xc3\xaf");
  CHECK(root->find("none")->is(Kind::kNone));
  const PyValue* flags = root->find("flags");
  REQUIRE(flags->is(Kind::kTuple));
  CHECK(flags->items[0]->boolean);
  CHECK_FALSE(flags->items[1]->boolean);
  const PyValue* deep = root->find("deep")->find("a");
  REQUIRE(deep->is(Kind::kList));
  CHECK(at::equal(deep->items[0]->find("b")->tensor, at::ones({2})));

  // Pickle protocol 4 gives the same tree.
  const auto p4 = load_torch_file(dir + "/values_p4.pt");
  for (const auto& [key, value] : tensors->entries) {
    INFO(key->text);
    CHECK(at::equal(p4->find("tensors")->find(key->text)->tensor, value->tensor));
  }
  CHECK(p4->find("ints")->items[3]->integer == -(int64_t{1} << 62));

  // Without tensors: shapes and dtypes only.
  const auto light = load_torch_file(dir + "/values.pt", TorchFileOptions{false});
  const PyValue* f16 = light->find("tensors")->find("f16");
  CHECK_FALSE(f16->tensor.defined());
  CHECK(f16->shape == std::vector<int64_t>{2, 2});
  CHECK(f16->dtype == at::kHalf);
}

TEST_CASE("torch.save files: bad input is a FormatError naming the file, nothing runs",
          "[torch_file]") {
  const std::string dir = curv_test::torch_fixtures() + "/reader";
  namespace fs = std::filesystem;
  CURV_CHECK_THROWS(load_torch_file(dir + "/evil.pt"), FormatError,
                    Contains("evil.pt") && Contains("system") && Contains("not allowed"));
  CURV_CHECK_THROWS(load_torch_file(dir + "/evil_p4.pt"), FormatError,
                    Contains("evil_p4.pt") && Contains("system") && Contains("not allowed"));
  CHECK_FALSE(fs::exists(dir + "/pwned"));
  CURV_CHECK_THROWS(load_torch_file(dir + "/big_endian.pt"), FormatError,
                    Contains("big_endian.pt") && Contains("byteorder"));
  CURV_CHECK_THROWS(load_torch_file(dir + "/legacy.pt"), FormatError,
                    Contains("legacy.pt") && Contains("legacy") && Contains("torch.save"));
  CURV_CHECK_THROWS(load_torch_file(dir + "/corrupt.pt"), FormatError,
                    Contains("corrupt.pt") && Contains("corrupt"));
  CURV_CHECK_THROWS(load_torch_file(dir + "/short_storage.pt"), FormatError,
                    Contains("short_storage.pt") && Contains("data/") && Contains("truncated"));
  CURV_CHECK_THROWS(load_torch_file(dir + "/missing.pt"), FormatError, Contains("missing.pt"));
  CURV_CHECK_THROWS(load_torch_file(dir + "/expected.safetensors"), FormatError,
                    Contains("not a zip archive"));
}

TEST_CASE("torch.save files: a damaged pickle is an error or a value, never a crash",
          "[torch_file]") {
  namespace fs = std::filesystem;
  const std::string dir = curv_test::torch_fixtures() + "/reader/damaged";
  int errors = 0, files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string path = entry.path().string();
    INFO(path);
    ++files;
    try {
      load_torch_file(path);  // a changed byte inside a string or a number can still be valid
    } catch (const FormatError& e) {
      ++errors;
      CHECK_THAT(e.what(), Contains(path));
    }
  }
  CHECK(files == 120);
  CHECK(errors >= 60);  // every cut pickle lacks its STOP
}

TEST_CASE("torch.save files: deep and cyclic pickles neither overflow the stack nor loop",
          "[torch_file]") {
  const std::string dir = curv_test::torch_fixtures() + "/reader";
  {
    const auto deep = load_torch_file(dir + "/deep.pt");
    REQUIRE(deep->is(Kind::kTuple));
    CHECK(deep->brief() == "((((...))))");
  }  // released here, level by level
  CURV_CHECK_THROWS(load_torch_file(dir + "/cyclic.pt"), FormatError,
                    Contains("cyclic.pt") && Contains("[[[[...]]]]"));
}

TEST_CASE("torch.save files: a changed byte inside a record fails its CRC-32 check",
          "[torch_file]") {
  namespace fs = std::filesystem;
  const std::string dir = curv_test::torch_fixtures() + "/reader";
  std::ifstream in(dir + "/values.pt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The local header of the first storage record: name, then the extra field, then the data.
  const size_t name = bytes.find("/data/0");
  REQUIRE(name != std::string::npos);
  const size_t header = bytes.rfind("PK\x03\x04", name);
  REQUIRE(header != std::string::npos);
  auto u16 = [&](size_t at) {
    return static_cast<size_t>(static_cast<uint8_t>(bytes[at])) |
           static_cast<size_t>(static_cast<uint8_t>(bytes[at + 1])) << 8;
  };
  const size_t data = header + 30 + u16(header + 26) + u16(header + 28);
  REQUIRE(data < bytes.size());
  bytes[data] = static_cast<char>(bytes[data] ^ 0x10);  // one bit of the first element
  curv_test::TempDir out;
  const std::string damaged = out.file("flipped.pt");
  std::ofstream(damaged, std::ios::binary) << bytes;
  CURV_CHECK_THROWS(load_torch_file(damaged), FormatError,
                    Contains("flipped.pt") && Contains("'data/0'") && Contains("CRC-32"));
  // Without tensors the damaged record is not read, and the rest checks out.
  CHECK_NOTHROW(load_torch_file(damaged, TorchFileOptions{false}));
  CHECK_NOTHROW(load_torch_file(dir + "/values.pt"));
}
