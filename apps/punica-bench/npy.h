// Minimal NumPy .npy (format 1.0) writer, so `check --dump` output opens in any tool.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace punica::bench {
// descr: "<f4", "<i4", ...; data is little-endian, C order.
void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data, std::size_t bytes);
}  // namespace punica::bench
