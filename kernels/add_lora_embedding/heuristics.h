// Launch heuristics of the sorted wide-N expand (add_lora_embedding, add_lora_logits), kept apart
// from the kernel: rows per tile TM (how many rows share one read of a B row) and the columns
// per block, then the rows per tile, shrunk until the grid covers every SM about twice.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

namespace punica::kernels {

// SM count of the current device (cached per device; no stream work, graph-capture safe).
inline int current_sm_count() {
  static int cache[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (!cache[dev]) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
      n = 132;
    cache[dev] = n;
  }
  return cache[dev];
}

struct SortedExpandConfig {
  int tm;       // rows per tile: 4, 8 or 16
  int threads;  // columns per block: 256 .. 64
};

inline SortedExpandConfig pick_sorted_expand_config(int64_t rows, int64_t cols, int sms) {
  SortedExpandConfig c{rows <= 4 ? 4 : rows <= 8 ? 8 : 16, 256};
  auto blocks = [&](int th) { return ((rows + c.tm - 1) / c.tm) * ((cols + th - 1) / th); };
  // Fewer columns per block first, then fewer rows per tile (more blocks, fewer slot runs each).
  while (blocks(c.threads) < 2 * int64_t(sms)) {
    if (c.threads > 64) c.threads /= 2;
    else if (c.tm > 4) c.tm /= 2;
    else break;
  }
  return c;
}

}  // namespace punica::kernels
