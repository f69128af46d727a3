// fmt formatters for the ATen types that appear in error messages (shapes, dtypes, devices).
#pragma once

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ostream.h>

template <>
struct fmt::formatter<c10::IntArrayRef> : fmt::ostream_formatter {};
template <>
struct fmt::formatter<c10::ScalarType> : fmt::ostream_formatter {};
template <>
struct fmt::formatter<c10::Device> : fmt::ostream_formatter {};
