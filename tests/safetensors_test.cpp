#include "curv/io/safetensors.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "curv/core/error.h"
#include "test_support.h"

namespace {

using curv_test::TempDir;
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  return bytes;
}

// A safetensors file with the given header text and data buffer, written byte by byte.
std::string make_file(const TempDir& dir, const std::string& header, const std::string& data = "") {
  const std::string path = dir.file("crafted.safetensors");
  write_bytes(path, le64(header.size()) + header + data);
  return path;
}

// Runs `action`, requires a curv::FormatError, and returns its message.
std::string format_error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const curv::FormatError& e) {
    return e.what();
  }
  FAIL("expected curv::FormatError");
  return {};
}

// Opening `path` must fail with a FormatError whose message names the file and every needle.
void require_open_error(const std::string& path, const std::vector<std::string>& needles) {
  const std::string message = format_error_of([&] { curv::SafetensorsReader reader(path); });
  INFO("message: " << message);
  CHECK_THAT(message, Catch::Matchers::Contains(path));
  for (const auto& needle : needles) CHECK_THAT(message, Catch::Matchers::Contains(needle));
}

// Same dtype, shape and bytes (so NaN payloads and -0.0 count too).
bool same_tensor(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

// Same dtype, shape and values, NaN matching NaN whatever its sign or payload.
bool same_values(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  return at::equal(a.isnan(), b.isnan()) && at::equal(at::where(a.isnan(), at::zeros_like(a), a),
                                                      at::where(b.isnan(), at::zeros_like(b), b));
}

at::Tensor sample_values(at::ScalarType type) {
  if (type == at::kBool) return at::arange(12).remainder(3).eq(0);
  if (at::isFloatingType(type)) {
    at::Tensor values = at::arange(12, at::kDouble) * 0.37 - 2.0;
    values[3] = std::numeric_limits<double>::infinity();
    values[4] = -0.0;
    values[5] = std::numeric_limits<double>::quiet_NaN();
    return values.to(type);
  }
  if (type == at::kByte) return at::arange(12).mul(21).to(type);
  return at::arange(-6, 6).mul(type == at::kChar ? 20 : 1000).to(type);
}

const std::vector<at::ScalarType> kWritableTypes = {
    at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong,
    at::kInt,    at::kShort, at::kChar, at::kByte,     at::kBool};

}  // namespace

TEST_CASE("safetensors round trip preserves every writable dtype and layout", "[safetensors]") {
  TempDir dir;
  NamedTensors written;
  for (auto type : kWritableTypes) {
    const std::string tag = c10::toString(type);
    const at::Tensor values = sample_values(type);
    written.emplace_back(tag + "/matrix", values.reshape({3, 4}));
    written.emplace_back(tag + "/transposed", values.reshape({3, 4}).t());
    written.emplace_back(tag + "/strided", values.slice(0, 1, 12, 3));
    written.emplace_back(tag + "/expanded", values[7].expand({2, 3}));
    written.emplace_back(tag + "/scalar", values[2].clone());
    written.emplace_back(tag + "/empty", values.slice(0, 0, 0));
    written.emplace_back(tag + "/empty3d", at::empty({2, 0, 3}, values.options()));
  }
  REQUIRE_FALSE(written[1].second.is_contiguous());
  const std::string path = dir.file("all.safetensors");
  curv::write_safetensors(path, written);
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));

  curv::SafetensorsReader reader(path);
  REQUIRE(reader.path() == path);
  REQUIRE(reader.names().size() == written.size());
  REQUIRE(reader.metadata().empty());
  for (const auto& [name, tensor] : written) {
    INFO("tensor " << name);
    REQUIRE(reader.contains(name));
    const at::Tensor back = reader.tensor(name);
    CHECK(back.is_contiguous());
    CHECK(same_tensor(back, tensor));
  }
  CHECK(reader.entry("Float/scalar").shape.empty());
  CHECK(reader.entry("Float/scalar").dtype == "F32");
  CHECK(reader.entry("BFloat16/matrix").dtype == "BF16");
  CHECK(reader.entry("Bool/matrix").dtype == "BOOL");
  CHECK(reader.entry("Byte/empty3d").shape == std::vector<int64_t>{2, 0, 3});
  const auto all = reader.tensors();
  REQUIRE(all.size() == written.size());
  for (size_t i = 0; i < all.size(); ++i) CHECK(all[i].first == reader.names()[i]);
}

TEST_CASE("safetensors round trip keeps metadata", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("meta.safetensors");
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "1200"}, {"note", "quotes \" and unicode \xC3\xA9"}, {"", ""}};
  curv::write_safetensors(path, {{"w", at::ones({2}, at::kFloat)}}, metadata);
  curv::SafetensorsReader reader(path);
  CHECK(reader.metadata() == metadata);

  // A file with no tensors at all is valid too.
  curv::write_safetensors(path, {}, {{"only", "metadata"}});
  curv::SafetensorsReader empty(path);
  CHECK(empty.names().empty());
  CHECK(empty.metadata().at("only") == "metadata");
}

TEST_CASE("safetensors writer follows the layout conventions", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("layout.safetensors");
  curv::write_safetensors(path, {{"b_byte", at::zeros({3}, at::kByte)},
                                 {"a_half", at::zeros({5}, at::kHalf)},
                                 {"z_double", at::zeros({2}, at::kDouble)},
                                 {"a_float", at::zeros({3}, at::kFloat)},
                                 {"a_double", at::zeros({1}, at::kDouble)}});
  const std::string bytes = read_bytes(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  CHECK(header_size % 8 == 0);
  CHECK(bytes.size() == 8 + header_size + 8 + 16 + 12 + 10 + 3);

  curv::SafetensorsReader reader(path);
  // Element size descending, then name; contiguous and aligned offsets.
  const std::vector<std::string> expected = {"a_double", "z_double", "a_float", "a_half", "b_byte"};
  REQUIRE(reader.names() == expected);
  uint64_t offset = 0;
  for (const auto& name : reader.names()) {
    const auto& entry = reader.entry(name);
    CHECK(entry.begin == offset);
    CHECK((8 + header_size + entry.begin) % reader.tensor(name).element_size() == 0);
    offset = entry.end;
  }
}

TEST_CASE("safetensors reader reads a file written by the Python fixture", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("fixture.safetensors");
  curv_test::run_python("write_safetensors_fixture.py", {path});
  curv::SafetensorsReader reader(path);

  CHECK(reader.metadata() == std::map<std::string, std::string>{
                                 {"format", "pt"}, {"source", "write_safetensors_fixture.py"}});
  CHECK(reader.names().size() == 19);
  CHECK(reader.names().front() == "f32");  // ordered by data offset, not by name or header order

  auto ar = [](int64_t n, at::ScalarType type) { return at::arange(n, at::TensorOptions(type)); };
  CHECK(same_tensor(reader.tensor("f32"), (ar(12, at::kFloat) * 0.5 - 2).reshape({3, 4})));
  CHECK(same_tensor(reader.tensor("f64"), ar(6, at::kDouble) / 3));
  CHECK(same_tensor(reader.tensor("f16"), ar(8, at::kHalf) * 0.25 - 1));
  CHECK(same_tensor(reader.tensor("bf16"),
                    (ar(8, at::kFloat) * 0.5 - 2).to(at::kBFloat16).reshape({2, 4})));
  CHECK(same_tensor(reader.tensor("i64"), ar(5, at::kLong) * int64_t{1000000000007} - 3));
  CHECK(same_tensor(reader.tensor("i32"), at::arange(-3, 3, at::kInt)));
  CHECK(same_tensor(reader.tensor("i16"), at::arange(-4, 4, at::kShort) * 1000));
  CHECK(same_tensor(reader.tensor("i8"), at::arange(-128, 128, 32, at::kInt).to(at::kChar)));
  CHECK(same_tensor(reader.tensor("u8"), ar(256, at::kByte).reshape({16, 16})));
  CHECK(same_tensor(reader.tensor("bool"), ar(7, at::kLong).remainder(3).eq(0)));
  CHECK(same_tensor(reader.tensor("scalar"), at::scalar_tensor(3.5, at::kDouble)));
  CHECK(same_tensor(reader.tensor("empty"), at::empty({0, 3}, at::kFloat)));
  // Unsigned dtypes LibTorch 1.13 lacks are widened.
  CHECK(same_tensor(reader.tensor("u16"),
                    at::tensor(std::vector<int32_t>{0, 1, 255, 256, 32767, 32768, 65535})));
  CHECK(same_tensor(reader.tensor("u32"),
                    at::tensor(std::vector<int64_t>{0, 1, 2147483648LL, 4294967295LL})));
  CHECK(same_tensor(reader.tensor("u64"),
                    at::tensor(std::vector<int64_t>{0, 1, std::numeric_limits<int64_t>::max()})));
  CHECK(reader.entry("u16").dtype == "U16");
  // Float8 decodes to float32 exactly as Python decodes it; NaN sign bits may differ.
  CHECK(same_values(reader.tensor("f8_e4m3"), reader.tensor("f8_e4m3_expected")));
  CHECK(same_values(reader.tensor("f8_e5m2"), reader.tensor("f8_e5m2_expected")));
}

TEST_CASE("safetensors float8 decoding matches known values", "[safetensors]") {
  TempDir dir;
  const std::string codes("\x00\x80\x38\x7E\xFE\x01\x08\x78\x7F\xFF", 10);
  const std::string path =
      make_file(dir,
                R"({"e4m3": {"dtype": "F8_E4M3", "shape": [10], "data_offsets": [0, 10]},
          "e5m2": {"dtype": "F8_E5M2", "shape": [8], "data_offsets": [10, 18]}})",
                codes + std::string("\x3C\x7B\x7C\xFC\x7D\x01\x04\xBC", 8));
  curv::SafetensorsReader reader(path);
  const at::Tensor e4m3 = reader.tensor("e4m3");
  REQUIRE(e4m3.scalar_type() == at::kFloat);
  const float* a = e4m3.data_ptr<float>();
  CHECK(a[0] == 0.0f);
  CHECK_FALSE(std::signbit(a[0]));
  CHECK(a[1] == 0.0f);
  CHECK(std::signbit(a[1]));
  CHECK(a[2] == 1.0f);
  CHECK(a[3] == 448.0f);  // the largest finite E4M3fn value
  CHECK(a[4] == -448.0f);
  CHECK(a[5] == std::ldexp(1.0f, -9));  // smallest subnormal
  CHECK(a[6] == std::ldexp(1.0f, -6));  // smallest normal
  CHECK(a[7] == 256.0f);                // exponent 15 is finite in the fn variant
  CHECK(std::isnan(a[8]));
  CHECK(std::isnan(a[9]));

  const at::Tensor e5m2 = reader.tensor("e5m2");
  const float* b = e5m2.data_ptr<float>();
  CHECK(b[0] == 1.0f);
  CHECK(b[1] == 57344.0f);
  CHECK(b[2] == std::numeric_limits<float>::infinity());
  CHECK(b[3] == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(b[4]));
  CHECK(b[5] == std::ldexp(1.0f, -16));
  CHECK(b[6] == std::ldexp(1.0f, -14));
  CHECK(b[7] == -1.0f);
}

TEST_CASE("safetensors U64 values beyond int64 are a FormatError", "[safetensors]") {
  TempDir dir;
  const std::string path =
      make_file(dir, R"({"big": {"dtype": "U64", "shape": [2], "data_offsets": [0, 16]}})",
                le64(5) + le64(uint64_t{1} << 63));
  curv::SafetensorsReader reader(path);  // the header is fine; the value is not
  const std::string message = format_error_of([&] { reader.tensor("big"); });
  CHECK_THAT(message, Catch::Matchers::Contains(path));
  CHECK_THAT(message, Catch::Matchers::Contains("'big'"));
  CHECK_THAT(message, Catch::Matchers::Contains("9223372036854775808"));
}

TEST_CASE("safetensors tensors outlive a moved reader", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("move.safetensors");
  curv::write_safetensors(path, {{"x", at::arange(4, at::kFloat)}});
  at::Tensor kept;
  {
    curv::SafetensorsReader first(path);
    curv::SafetensorsReader second(std::move(first));
    curv::SafetensorsReader third(dir.file("move.safetensors"));
    third = std::move(second);
    kept = third.tensor("x");
    CHECK(third.path() == path);
  }
  CHECK(same_tensor(kept, at::arange(4, at::kFloat)));
}

TEST_CASE("safetensors reader names the file and key of a missing tensor", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("few.safetensors");
  curv::write_safetensors(path, {{"present", at::zeros({1})}});
  curv::SafetensorsReader reader(path);
  CHECK_FALSE(reader.contains("absent"));
  for (const auto& message : {format_error_of([&] { reader.entry("absent"); }),
                              format_error_of([&] { reader.tensor("absent"); })}) {
    CHECK_THAT(message, Catch::Matchers::Contains(path));
    CHECK_THAT(message, Catch::Matchers::Contains("'absent'"));
  }
}

TEST_CASE("safetensors reader accepts gaps, zero-size tensors and padding", "[safetensors]") {
  TempDir dir;
  // A gap (bytes 2..3) after "a", an empty tensor whose other dimensions would overflow, a 0-dim
  // tensor, and a header padded with trailing spaces.
  const std::string header =
      R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},)"
      R"( "none": {"dtype": "F64", "shape": [0, 5], "data_offsets": [2, 2]},)"
      R"( "huge_but_empty": {"dtype": "F32", "data_offsets": [3, 3],)"
      R"(  "shape": [9223372036854775807, 0, 9223372036854775807]},)"
      R"( "b": {"dtype": "I16", "shape": [], "data_offsets": [4, 6]}}       )";
  const std::string path = make_file(dir, header, std::string("\x01\x02\xAA\xBB\x07\x00", 6));
  curv::SafetensorsReader reader(path);
  CHECK(reader.names() == std::vector<std::string>{"a", "none", "huge_but_empty", "b"});
  CHECK(reader.tensor("b").item<int16_t>() == 7);
  CHECK(reader.tensor("none").sizes() == at::IntArrayRef({0, 5}));
  CHECK(reader.tensor("huge_but_empty").numel() == 0);
}

TEST_CASE("safetensors reader rejects a missing file, a directory and short files",
          "[safetensors]") {
  TempDir dir;
  require_open_error(dir.file("nope.safetensors"), {"cannot open"});
  require_open_error(dir.path(), {"directory"});
  write_bytes(dir.file("empty.safetensors"), "");
  require_open_error(dir.file("empty.safetensors"), {"0 bytes"});
  write_bytes(dir.file("short.safetensors"), std::string("\x05\0\0\0\0", 5));
  require_open_error(dir.file("short.safetensors"), {"5 bytes"});
}

TEST_CASE("safetensors reader rejects a header length past the end of the file", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("truncated.safetensors");
  write_bytes(path, le64(1000) + "{}");
  require_open_error(path, {"1000", "past the end"});
  write_bytes(path, le64(uint64_t{1} << 40) + "{}");
  require_open_error(path, {"1099511627776", "absurd"});
  write_bytes(path, le64(~uint64_t{0}));
  require_open_error(path, {"18446744073709551615"});
}

TEST_CASE("safetensors reader rejects a header that is not JSON", "[safetensors]") {
  TempDir dir;
  require_open_error(make_file(dir, "{not json"), {"not valid JSON"});
  require_open_error(make_file(dir, "{} trailing"), {"not valid JSON"});
  require_open_error(make_file(dir, "{\"\xFF\": 1}"), {"not valid JSON"});
  require_open_error(make_file(dir, ""), {"not valid JSON"});
}

TEST_CASE("safetensors reader rejects a header that is not an object", "[safetensors]") {
  TempDir dir;
  require_open_error(make_file(dir, "[1, 2]"), {"object", "array"});
  require_open_error(make_file(dir, "42"), {"object"});
  require_open_error(make_file(dir, R"({"w": [1, 2]})"), {"'w'", "object"});
}

TEST_CASE("safetensors reader rejects entries missing a field", "[safetensors]") {
  TempDir dir;
  require_open_error(make_file(dir, R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", "abcd"),
                     {"'w'", "dtype"});
  require_open_error(make_file(dir, R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", "abcd"),
                     {"'w'", "shape"});
  require_open_error(make_file(dir, R"({"w": {"dtype": "F32", "shape": [1]}})", "abcd"),
                     {"'w'", "data_offsets"});
}

TEST_CASE("safetensors reader rejects fields of the wrong type", "[safetensors]") {
  TempDir dir;
  require_open_error(
      make_file(dir, R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", "abcd"),
      {"'w'", "dtype", "5"});
  require_open_error(
      make_file(dir, R"({"w": {"dtype": "F32", "shape": "x", "data_offsets": [0, 4]}})", "abcd"),
      {"'w'", "shape", "\"x\""});
  require_open_error(
      make_file(dir, R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", "abcd"),
      {"'w'", "1.5"});
  require_open_error(
      make_file(dir, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": {"a": 0}}})", "abcd"),
      {"'w'", "data_offsets"});
}

TEST_CASE("safetensors reader rejects an unknown dtype", "[safetensors]") {
  TempDir dir;
  for (const std::string dtype : {"F8_E8M0", "C64", "f32", "F4"}) {
    require_open_error(
        make_file(dir,
                  R"({"w": {"dtype": ")" + dtype + R"(", "shape": [1], "data_offsets": [0, 1]}})",
                  "a"),
        {"'w'", "'" + dtype + "'"});
  }
}

TEST_CASE("safetensors reader rejects a negative dimension", "[safetensors]") {
  TempDir dir;
  require_open_error(
      make_file(dir, R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})",
                std::string(8, '\0')),
      {"'w'", "-1"});
}

TEST_CASE("safetensors reader rejects malformed data_offsets", "[safetensors]") {
  TempDir dir;
  const std::string data(8, '\0');
  require_open_error(
      make_file(dir, R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [8, 4]}})", data),
      {"'w'", "[8, 4]", "begin > end"});
  require_open_error(
      make_file(dir, R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4, 8]}})", data),
      {"'w'", "[0,4,8]"});
  require_open_error(
      make_file(dir, R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [-4, 0]}})", data),
      {"'w'", "[-4,0]"});
}

TEST_CASE("safetensors reader rejects data_offsets past the end of the data", "[safetensors]") {
  TempDir dir;
  require_open_error(
      make_file(dir, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
                std::string(12, '\0')),
      {"'w'", "16", "past the end", "12 bytes"});
}

TEST_CASE("safetensors reader rejects a byte size that does not match the shape", "[safetensors]") {
  TempDir dir;
  require_open_error(
      make_file(dir, R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})",
                std::string(16, '\0')),
      {"'w'", "[3]", "12 bytes", "16"});
  // A shape whose byte count wraps around 2^64 to the stored size must not slip through.
  require_open_error(
      make_file(
          dir,
          R"({"w": {"dtype": "F64", "shape": [2305843009213693952, 1], "data_offsets": [0, 0]}})"),
      {"'w'", "2^64"});
}

TEST_CASE("safetensors reader rejects overlapping tensors", "[safetensors]") {
  TempDir dir;
  require_open_error(make_file(dir,
                               R"({"first": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "second": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                               std::string(12, '\0')),
                     {"'first'", "'second'", "overlap"});
  // Overlap with an earlier, longer tensor that is not the immediate predecessor.
  require_open_error(make_file(dir,
                               R"({"long": {"dtype": "U8", "shape": [10], "data_offsets": [0, 10]},
                    "inner": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]},
                    "later": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]}})",
                               std::string(10, '\0')),
                     {"'long'", "overlap"});
}

TEST_CASE("safetensors reader rejects malformed metadata and duplicate keys", "[safetensors]") {
  TempDir dir;
  require_open_error(make_file(dir, R"({"__metadata__": {"step": 12}})"),
                     {"__metadata__", "'step'", "12"});
  require_open_error(make_file(dir, R"({"__metadata__": ["a"]})"), {"__metadata__"});
  require_open_error(make_file(dir, R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                         "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                               "ab"),
                     {"'w'", "twice"});
}

TEST_CASE("write_safetensors into a missing directory throws naming the path", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/out.safetensors");
  const std::string message = format_error_of([&] {
    curv::write_safetensors(path, {{"x", at::zeros({2})}});
  });
  CHECK_THAT(message, Catch::Matchers::Contains(path));
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("write_safetensors rejects bad input and leaves an existing file intact",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("keep.safetensors");
  curv::write_safetensors(path, {{"x", at::arange(3, at::kFloat)}}, {{"v", "1"}});
  const std::string before = read_bytes(path);

  const std::vector<std::pair<std::string, NamedTensors>> bad = {
      {"duplicate", {{"a", at::zeros({1})}, {"a", at::ones({1})}}},
      {"empty name", {{"", at::zeros({1})}}},
      {"__metadata__", {{"__metadata__", at::zeros({1})}}},
      {"complex", {{"c", at::zeros({2}, at::kComplexFloat)}}},
      {"undefined", {{"u", at::Tensor()}}},
      {"sparse", {{"s", at::zeros({2, 2}).to_sparse()}}},
      {"utf8", {{"bad\xFFname", at::zeros({1})}}},
  };
  for (const auto& [label, tensors] : bad) {
    INFO("case " << label);
    try {
      curv::write_safetensors(path, tensors);
      FAIL("expected curv::InvalidArgument");
    } catch (const curv::InvalidArgument& e) {
      CHECK_THAT(e.what(), Catch::Matchers::Contains(path));
    }
    CHECK(read_bytes(path) == before);
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  }
  // And a valid write does replace it.
  curv::write_safetensors(path, {{"y", at::ones({2}, at::kDouble)}});
  curv::SafetensorsReader reader(path);
  CHECK(reader.names() == std::vector<std::string>{"y"});
  CHECK(reader.metadata().empty());
}

TEST_CASE("write_safetensors onto a directory fails without leaving a temp file", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("occupied");
  std::filesystem::create_directory(path);
  std::filesystem::create_directory(path + "/child");  // rename() cannot replace a non-empty dir
  const std::string message = format_error_of([&] {
    curv::write_safetensors(path, {{"x", at::zeros({2})}});
  });
  CHECK_THAT(message, Catch::Matchers::Contains(path));
  CHECK(std::filesystem::is_directory(path));
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_CASE("bytes quoted from a damaged file reach the message escaped as valid UTF-8",
          "[safetensors]") {
  TempDir dir;
  // A tensor name with an invalid UTF-8 byte and a control character, in an otherwise valid file.
  const std::string name = std::string("w\xff") + "\x01" + "ß";
  const std::string message = format_error_of([&] {
    curv::SafetensorsReader(make_file(dir,
                                      R"({")" + name +
                                          R"(": {"dtype": "XX", "shape": [1], )"
                                          R"("data_offsets": [0, 4]}})",
                                      std::string(4, '\0')));
  });
  INFO(message);
  CHECK(message.find('\xff') == std::string::npos);
  CHECK(message.find('\x01') == std::string::npos);
  CHECK(curv::printable_message(message) == message);  // valid UTF-8, nothing left to escape
  CHECK_THAT(message, Catch::Matchers::Contains("crafted.safetensors"));
}

TEST_CASE("printable_message escapes invalid UTF-8 and control bytes only", "[safetensors]") {
  CHECK(curv::printable_message("plain ascii, ü, λ, 😀\nand a tab\t") ==
        "plain ascii, ü, λ, 😀\nand a tab\t");
  CHECK(curv::printable_message(std::string("a\xff") + "b") == "a\\xffb");
  CHECK(curv::printable_message(std::string("\x01\x7f")) == "\\x01\\x7f");
  CHECK(curv::printable_message(std::string("\xc3")) == "\\xc3");                    // cut sequence
  CHECK(curv::printable_message(std::string("\xc0\xaf")) == "\\xc0\\xaf");           // overlong '/'
  CHECK(curv::printable_message(std::string("\xed\xa0\x80")) == "\\xed\\xa0\\x80");  // surrogate
  CHECK(std::string(curv::FormatError(std::string("key \xfe")).what()) == "key \\xfe");
}
