// Errors for bad user input. The command line prints what() and exits with status 2; a fault of
// the machine (MachineError) and anything else that escapes exit with status 1.
#pragma once
#include <stdexcept>
#include <string>

namespace moesim {

/// Bad input: a file that does not parse, a value out of range, an unknown name.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A value that fails validation, named by its field path in the message being validated
/// ("node.links[2].gbytes_per_s"). The spec loader turns the path into file:line.
class FieldError : public InputError {
 public:
  FieldError(std::string field, const std::string& message)
      : InputError(field + ": " + message), field_(std::move(field)), message_(message) {}
  const std::string& field() const { return field_; }
  const std::string& message() const { return message_; }

 private:
  std::string field_;
  std::string message_;
};

/// A fault of the machine, not of the input: a GPU, driver, NCCL or MPI failure, a peer that never
/// answered. The message names what failed and, where it is an op of the graph, which op.
class MachineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace moesim
