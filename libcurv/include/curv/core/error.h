// Error hierarchy of libcurv: every failure the user can act on is a curv::Error whose message
// names the file, key or field and the offending value. Non-convergence is a status, not an error.
#pragma once

#include <stdexcept>
#include <string>

namespace curv {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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

// NaN or Inf appeared in a loss, gradient or Hessian-vector product.
class NumericalError : public Error {
 public:
  using Error::Error;
};

}  // namespace curv
