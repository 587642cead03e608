// Errors that reach the user. Every failure amsp reports is one line that names
// what is wrong and what was expected; the exit code says whose fault it was.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace amsp {

// Exit codes, documented in doc/cli.md. Scripts depend on them.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,  // a runtime failure: I/O error, library error, bad checkpoint
  kExitUsage = 2,    // bad input from the user: options, configs, datasets
  kExitPreempted = 75,  // stopped on SIGUSR1/SIGTERM after a checkpoint: requeue to resume
                        // (EX_TEMPFAIL of sysexits.h: "try again later")
};

// Concatenates anything streamable into one string: cat("got ", n, " tokens").
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// The parts with sep between them: join({"a", "b"}, ", ") is "a, b".
inline std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

// An error with a one-line message and the exit code it should end with.
class Error : public std::runtime_error {
 public:
  Error(std::string message, int exit_code = kExitFailure)
      : std::runtime_error(std::move(message)), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Bad input: options, configs, datasets. Exit code 2.
class UsageError : public Error {
 public:
  explicit UsageError(std::string message) : Error(std::move(message), kExitUsage) {}
};

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(cat(std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_usage(Args&&... args) {
  throw UsageError(cat(std::forward<Args>(args)...));
}

}  // namespace amsp
