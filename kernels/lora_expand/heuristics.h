// Host-side launch configuration of lora_expand (vLLM add_expand): the decode kernel
// (expand_decode.cu) for small batches; for prefill the pipelined / streaming mma.sync kernels
// (expand_stream.cuh) and the staged kernel for layouts without 16-byte rows.
// Decided from static shapes only; no device value is read.
#pragma once
#include <algorithm>
#include <cstdint>
#include "kernels/common/dtype.h"

namespace punica::kernels::expand_heur {

constexpr int kGemvThreads = 256;
constexpr int kGemvCols = 128;     // output columns per block
constexpr int kGemvTokens = 8;     // tokens sharing one load of B
constexpr int64_t kDecodeMaxTokens = 128;
// Staged prefill kernel: BM tokens x BN columns per block, rank chunks of BK, 8 warps as 4 x 2
// (each 32 tokens x 64 columns); y row pitch in shared memory padded by 16 bytes.
constexpr int kStBM = 128, kStBN = 128, kStBK = 64, kStThreads = 256, kStYPitch = kStBN + 8;
// __launch_bounds__ min blocks per SM: 3 (register cap 80, ~120 B spill, 3 x 69.6 KB smem) measured
// 5-13% faster than 2 (cap 128, no spill) on H200 prefill shapes (T=8192, r=16/64, S=1/3); 3% slower
// only for r=64 with one adapter.
constexpr int kStMinBlocks = 3;
// Pipelined prefill kernel (expand_pipe_kernel), column tiles per block (H200, T=8192, 8-32
// adapters, cold, fraction of the DRAM floor; the staged kernel reads 0.35-0.47 on these shapes):
//  max_rank <= 16: 64 tokens x 128 columns, 2 stages, 4 blocks/SM, 4 tiles per block: 0.65-0.74
//    (3 stages / 3 blocks: 0.63-0.68; 128 x 128: 0.64-0.73; 2 or 8 tiles per block: 0.57-0.63; a
//    tiles-per-block count that balances the grid on the SMs: no better, 0.60-0.71).
//  max_rank <= 64: 64 x 64 tiles, 3 stages, 3 blocks/SM, 8 tiles per block: 0.45-0.52 (64 x 128
//    with 2 stages: 0.37-0.57; 4 tiles per block: 0.38-0.44).
// Above rank 64 the streaming kernel (64 x 128, rank chunks of 32, 4 blocks/SM): 0.42-0.61.
// Tiles per block: at most these, fewer when one wave of resident blocks covers the batch with
// fewer (T=2048 r=16: 2 tiles 0.43 vs 4 tiles 0.41).
constexpr int kPipeTiles16 = 4;
constexpr int kPipeTiles64 = 8;

inline bool use_mma(DType dtype, int64_t T, int max_rank, bool b_aligned) {
  return dtype != DType::f32 && T > kDecodeMaxTokens && max_rank % 8 == 0 && b_aligned;
}

// Decode kernel (expand_decode.cu, every shape the mma kernels do not take): 4 warps per block;
// tokens of one adapter sharing a block's B loads; above 512 the rank is refused.
constexpr int kDecThreads = 128;
constexpr int kDecTokens = 4;  // token tiles (T > 65535 only)
constexpr int kDecMaxRank = 512;
// One token per block, its slot read straight from token_lora_mapping (two dependent loads fewer
// than the sorted-token tiles), when the batch averages under two tokens per adapter.
// Measured on H200 (bench_lora_ops decode cases, back to back): one token per block beat tiles of
// 4 tokens of one adapter everywhere (T=16..64, 1..32 adapters: the tile kernel's longer dependent
// metadata chain and register pressure cost more than B's L2 re-reads), so tiles serve only
// grids past 65535 tokens.
inline bool decode_per_token(int64_t T, int /*max_loras*/) { return T <= 65535; }
// The older wide-N GEMV (blocks per adapter, a token loop) stays faster for T >= 64 with 4..16
// tokens per adapter (H200, T=64, 8 adapters: 7.0 vs 8.2 us at H=4096 r=16, 22.4 vs 33.3 us at
// H=8192 r=64); with 1 or 32 adapters it is 1.1-3x slower than the decode kernel.
inline bool decode_use_gemv(int64_t T, int max_loras) {
  return T >= 64 && T >= 4 * int64_t(max_loras) && T <= 16 * int64_t(max_loras);
}

}  // namespace punica::kernels::expand_heur
