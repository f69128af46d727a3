// Error hierarchy of libcurv: every failure the user can act on is a curv::Error whose message
// names the file, key or field and the offending value. Non-convergence is a status, not an error.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace curv {

// Messages often quote bytes read from a file (a key, a name, a parser's excerpt): they are kept
// valid UTF-8 for terminals and HDF5 attributes, each invalid byte and control character other
// than newline and tab written as \xNN (printable_message).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message);
  explicit Error(const char* message);
};

// `text` with every byte that is not part of a valid UTF-8 sequence, and every control character
// but '\n' and '\t', written as \xNN; valid UTF-8 passes unchanged.
std::string printable_message(const std::string& text);

// A user-supplied option, argument or shape is out of range or inconsistent.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// An option of a library Options struct is out of range or inconsistent. The message is kept
// as a text with placeholders {0}, {1}, ... and the options they stand for, so that a tool names
// each option by its own flag ("--eig-top 3 must be >= 1") from the option's name, with no
// rewriting of message text; what() names them as the library does ("EigenOptions.top = 3").
class InvalidOption : public InvalidArgument {
 public:
  struct Named {
    std::string option;  // "Struct.field", or "Struct" for the struct as a whole
    std::string value;   // as written in the message; empty: the option is named alone
  };
  // `text`: the message, with "{i}" where options[i] goes and "{{", "}}" for literal braces.
  InvalidOption(std::string text, std::vector<Named> options);
  // `text` (a path, a user's pattern) with its braces doubled, to be quoted in a message text.
  static std::string literal(const std::string& text);
  const std::vector<Named>& options() const { return options_; }
  // The message with each option written by `name`.
  std::string render(const std::function<std::string(const Named&)>& name) const;
  // "Struct.field = value", or "Struct.field" when there is no value.
  static std::string library_name(const Named& named);

 private:
  std::string text_;
  std::vector<Named> options_;
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
