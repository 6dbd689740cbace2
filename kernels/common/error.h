// One typed error for every failure (CUDA, cuBLAS, NCCL, MPI, bad input); main maps the kind to
// the exit codes of DESIGN §3, so no code path invents its own return value.
#pragma once
#include <stdexcept>
#include <string>

namespace punica {

enum class ErrorKind : int {
  wrong_result = 1,   // a check failed (rarely thrown; usually reported per case)
  usage = 2,          // bad flag, bad scenario file, bad field
  perf_gate = 3,
  environment = 4,    // cannot run here (no GPU, too few ranks)
  timeout = 5,
  runtime = 6,        // CUDA / cuBLAS / NCCL / MPI / internal
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return static_cast<int>(kind_); }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind k, const std::string& msg) { throw Error(k, msg); }

inline std::string where(const char* file, int line) {
  std::string f(file);
  auto p = f.rfind('/');
  if (p != std::string::npos) f = f.substr(p + 1);
  return f + ":" + std::to_string(line);
}

}  // namespace punica

#define PUNICA_REQUIRE(cond, kind, msg)                                                  \
  do {                                                                                   \
    if (!(cond)) ::punica::fail((kind), std::string(msg));                               \
  } while (0)
