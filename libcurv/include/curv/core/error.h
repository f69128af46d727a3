// Error hierarchy of libcurv: every failure the user can act on is a curv::Error whose message
// names the file, key or field and the offending value. Non-convergence is a status, not an error.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace curv {

// A library option a message names, kept apart from the message's text so that each program
// names it its own way: a tool by its flag ("--eig-top 3"), the Python package by its keyword
// ("top=3"), the library itself as "EigenOptions.top = 3".
struct NamedOption {
  std::string option;  // "Struct.field", or "Struct" for the struct as a whole
  std::string value;   // as written in the message; empty: the option is named alone
};

// Messages often quote bytes read from a file (a key, a name, a parser's excerpt): they are kept
// valid UTF-8 for terminals and HDF5 attributes, each invalid byte and control character other
// than newline and tab written as \xNN (printable_message).
//
// Any error may name options: its message is then a text with placeholders {0}, {1}, ... and
// the options they stand for, and what() writes them as the library does (library_name).
class Error : public std::runtime_error {
 public:
  using Named = NamedOption;
  explicit Error(const std::string& message);
  explicit Error(const char* message);
  // `text`: the message, with "{i}" where options[i] goes and "{{", "}}" for literal braces.
  Error(std::string text, std::vector<Named> options);

  const std::vector<Named>& options() const { return options_; }
  // The message with placeholders, as `text` was given (a plain message with its braces doubled),
  // to build a longer message that keeps naming the same options.
  std::string text() const;
  // The message with each option written by `name`.
  std::string render(const std::function<std::string(const Named&)>& name) const;
  // "Struct.field = value", or "Struct.field" when there is no value.
  static std::string library_name(const Named& named);
  // `text` (a path, a user's pattern) with its braces doubled, to be quoted in a message text.
  static std::string literal(const std::string& text);

 private:
  std::string text_;  // empty for a plain message
  std::vector<Named> options_;
};

// `text` with every byte that is not part of a valid UTF-8 sequence, and every control character
// but '\n' and '\t', written as \xNN; valid UTF-8 passes unchanged.
std::string printable_message(const std::string& text);

// A user-supplied option, argument or shape is out of range or inconsistent.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// An option of a library Options struct is out of range or inconsistent; the message names it
// (and any other option it concerns) as a NamedOption.
class InvalidOption : public InvalidArgument {
 public:
  InvalidOption(std::string text, std::vector<Named> options);
};

// A file is missing, truncated, corrupt or does not follow its format.
class FormatError : public Error {
 public:
  using Error::Error;
};

// A model cannot be loaded, run on the given batch, or differentiated twice.
class ModelError : public Error {
 public:
  using Error::Error;
};

// The device (or the host) ran out of memory during a pass; the message names the pass, the
// batch, the memory in use and the options that lower it.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// NaN or Inf appeared in a loss, gradient or Hessian-vector product.
class NumericalError : public Error {
 public:
  using Error::Error;
};

}  // namespace curv
