// NumPy .npy writer (see npy.h).
#include "apps/punica-bench/npy.h"
#include <fstream>
#include "kernels/common/error.h"

namespace punica::bench {
void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data, std::size_t bytes) {
  std::string sh = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) sh += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
  sh += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + sh + ", }";
  std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  PUNICA_REQUIRE(f, ErrorKind::usage, path + ": cannot open for writing");
  const char magic[] = "\x93NUMPY";
  f.write(magic, 6);
  char ver[2] = {1, 0};
  f.write(ver, 2);
  uint16_t hl = uint16_t(header.size());
  f.write(reinterpret_cast<const char*>(&hl), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(static_cast<const char*>(data), std::streamsize(bytes));
  PUNICA_REQUIRE(f.good(), ErrorKind::runtime, path + ": write failed");
}
}  // namespace punica::bench
