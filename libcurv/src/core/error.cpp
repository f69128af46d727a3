#include "curv/core/error.h"

#include <cstdint>
#include <cstdio>
#include <utility>

namespace curv {

namespace {

// Length of the valid UTF-8 sequence starting at text[i] (1 to 4), or 0 if there is none:
// overlong forms, surrogates and code points above U+10FFFF are invalid.
size_t utf8_sequence(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  size_t n = 0;
  uint32_t code = 0, min = 0;
  if (b0 < 0x80) return 1;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, code = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, code = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, code = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

std::string printable_message(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<uint8_t>(text[i]);
    const size_t n = utf8_sequence(text, i);
    if (n == 0 || (n == 1 && ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7F))) {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", b);
      out += escaped;
      ++i;
    } else {
      out.append(text, i, n);
      i += n;
    }
  }
  return out;
}

namespace {

std::string render_text(const std::string& text, const std::vector<NamedOption>& options,
                        const std::function<std::string(const NamedOption&)>& name) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((text[i] == '{' || text[i] == '}') && i + 1 < text.size() && text[i + 1] == text[i]) {
      out += text[i++];
      continue;
    }
    const size_t close = text[i] == '{' ? text.find('}', i) : std::string::npos;
    if (close != std::string::npos && close > i + 1 &&
        text.find_first_not_of("0123456789", i + 1) == close) {
      const size_t k = std::stoul(text.substr(i + 1, close - i - 1));
      if (k < options.size()) {
        out += name(options[k]);
        i = close;
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

}  // namespace

Error::Error(const std::string& message) : std::runtime_error(printable_message(message)) {}
Error::Error(const char* message) : Error(std::string(message)) {}
Error::Error(std::string text, std::vector<Named> options)
    : std::runtime_error(printable_message(render_text(text, options, library_name))),
      text_(std::move(text)),
      options_(std::move(options)) {}

std::string Error::text() const { return options_.empty() ? literal(what()) : text_; }

std::string Error::render(const std::function<std::string(const Named&)>& name) const {
  if (options_.empty()) return what();
  return printable_message(render_text(text_, options_, name));
}

std::string Error::literal(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '{' || c == '}') out += c;
    out += c;
  }
  return out;
}

std::string Error::library_name(const Named& named) {
  return named.value.empty() ? named.option : named.option + " = " + named.value;
}

InvalidOption::InvalidOption(std::string text, std::vector<Named> options)
    : InvalidArgument(std::move(text), std::move(options)) {}

}  // namespace curv
