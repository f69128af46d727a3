// Error hierarchy of libcurv: every failure the user can act on is a curv::Error whose message
// names the file, key or field and the offending value. Non-convergence is a status, not an error.
#pragma once

#include <stdexcept>
#include <string>

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
