// Checks made before any work (see preflight.h).
#include "apps/punica-bench/preflight.h"
#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include "kernels/common/error.h"

namespace punica::bench {

void check_output_path(const std::string& path, bool overwrite, const std::string& flag) {
  if (path.empty() || path == "-") return;
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string arg = flag + " " + path;
  PUNICA_REQUIRE(!fs::is_directory(path, ec), ErrorKind::usage,
                 arg + ": is a directory (give the result file's name, e.g. " +
                     (fs::path(path) / "result.json").string() + ")");
  PUNICA_REQUIRE(overwrite || !fs::exists(fs::symlink_status(path, ec)), ErrorKind::usage,
                 path + ": output file already exists (pass --overwrite to replace it)");
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  PUNICA_REQUIRE(fs::exists(dir, ec), ErrorKind::usage,
                 arg + ": the folder " + dir.string() + " does not exist (create it first)");
  PUNICA_REQUIRE(fs::is_directory(dir, ec), ErrorKind::usage, arg + ": " + dir.string() + " is not a folder");
  // the file is written as a temporary beside it and renamed: the folder must take a new file (tried,
  // since access() says yes to root on a read-only file system)
  const std::string probe = (dir / (".punica-bench-probe." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  const int e = errno;
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
  PUNICA_REQUIRE(fd >= 0, ErrorKind::usage, arg + ": cannot write in the folder " + dir.string() + ": " + std::strerror(e));
}

void check_input_file(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  PUNICA_REQUIRE(!fs::is_directory(path, ec), ErrorKind::usage,
                 path + ": is a directory (expected a " + what + " JSON file)");
  errno = 0;
  std::ifstream f(path, std::ios::binary);
  const int e = errno;
  PUNICA_REQUIRE(f.is_open(), ErrorKind::usage,
                 "cannot open " + path + ": " + (e ? std::strerror(e) : "unreadable") + " (expected a " + what +
                     " JSON file)");
}

std::string number_at_least(const std::string& text, double lo, bool integer) {
  char bound[32];
  std::snprintf(bound, sizeof bound, "%g", lo);
  const std::string want = std::string(integer ? "an integer" : "a number") + " >= " + bound;
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  const bool parsed = end != s && *end == '\0' && errno != ERANGE;
  if (!parsed || !std::isfinite(v) || v < lo || (integer && v != std::floor(v)))
    return "expected " + want + ", got '" + text + "'";
  return "";
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest_name(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  std::size_t best_d = 3;  // a typo: at most two edits
  for (const auto& n : names) {
    const std::size_t d = edit_distance(word, n);
    if (d < best_d && d < std::max<std::size_t>(n.size(), 1)) { best = n; best_d = d; }
  }
  return best;
}

}  // namespace punica::bench
