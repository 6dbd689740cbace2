// Host-side launch configuration of lora_expand (vLLM add_expand): the decode kernel
// (expand_decode.cu) for small batches; for prefill the pipelined / streaming mma.sync kernels
// (expand_stream.cuh) and the staged kernel for layouts without 16-byte rows.
// Decided from static shapes only; no device value is read.
#pragma once
#include <algorithm>
#include <cstdint>
#include "kernels/common/dtype.h"
#include "kernels/lora_expand/lora_expand.h"

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
// Above rank 64 the streaming kernel (64 x 128, rank chunks of 32, 4 blocks/SM): 0.42-0.61; with
// an fp32 x (the intermediate vLLM and add_lora_linear pass) ranks 65-128 take the pipelined kernel
// at RK = 128 (below, kPipe128MaxRank).
// Tiles per block: at most these, fewer when one wave of resident blocks covers the batch with
// fewer (T=2048 r=16: 2 tiles 0.43 vs 4 tiles 0.41).
constexpr int kPipeTiles16 = 4;
constexpr int kPipeTiles64 = 8;
// Ranks 17-64 from kPipeDualMinTokens tokens (fp32 x): the dual kernel (expand_pipe_dual_kernel), the
// 64 x 64 kernel's blocks but with the rank-16 kernel's 64 x 128 tiles wherever the block's adapter
// has rank <= 16 (the host knows only max_rank). Measured on the H200 (bench A/B, exp/pipe64-tall
// 266fc9b against main's rule in the same binary, results/NOTES.md v30, back to back / cold):
// mixed ranks 8/16/64 at T=8192, expand one slice 51.1 -> 45.5 us (0.89 / 0.90), qkv 0.93 / 0.93,
// add_lora_linear 0.93 / 0.93 and 0.98 / 0.98; the Llama-3-8B prefill layers (zipf, 25% without
// adapter, 4096-16384 tokens) gate_up 0.92-0.94 (T=16384 495.7 -> 453.8 us), down 0.92-0.98, o
// 0.95-1.01, qkv 0.97-1.02 (cold up to 1.05); uniform rank 64 0.94-1.02 (H=4096 one slice with 8 / 32
// adapters 1.02 back to back, 1.01-1.02 cold; add_lora_linear qkv 1.01-1.02 back to back, 1.00 cold).
// Below 4096 tokens not: at T=1024-2048 up to 1.14x slower; not the even tile count but a partial
// 2nd wave landing unevenly (H=8192) and, mixed ranks back to back, PDL (NOTES v31 parts 1 and 3).
constexpr int64_t kPipeDualMinTokens = 4096;
// Ranks 65-128 (fp32 x, issue 47): the pipelined kernel with the whole rank staged (RK = 128), 64 x
// 64 tiles, 3 stages, 2 blocks per SM (97 KB of shared memory each), where the streaming kernel
// stages its rank in 4 chunks of 32 behind one wait each, so that only the first chunk's loads
// overlap y's (off-grid bench at edf89d1: rank 128 at H=5120 0.22-0.37 of the floor). The block's
// k steps stop at its adapter's true rank (mixed ranks: a rank-8 adapter's tiles do 1 of 8). Where
// the streaming kernel is the rule below 512 tokens (prefer_stream) it stays until measured.
constexpr int kPipe128MaxRank = 128;
inline bool pipe128_ok(DType in_dtype, int max_rank) {
  return in_dtype == DType::f32 && max_rank > 64 && max_rank <= kPipe128MaxRank;
}
inline bool pipe_dual(int64_t T) { return T >= kPipeDualMinTokens; }
// The streaming kernel's rank chunks (BK = 32) in shared memory: above rank 64 two, chunk k + 1
// loaded while chunk k is multiplied (64-row tiles then at 3 blocks per SM: 58 KB each with an fp32
// x); up to rank 64 (at most two chunks, the tuned small-batch shapes) one.
constexpr int kStreamTwoChunkMinRank = 65;
inline int stream_chunks(int max_rank) { return max_rank >= kStreamTwoChunkMinRank ? 2 : 1; }

// The 64 x 64 kernel without the dual form (ranks 17-64 below kPipeDualMinTokens, or a 16-bit x):
// where the wave fit asks for more than kPipeTiles64 tiles per block, up to kPipeTiles64OneWave
// tiles if that puts every working block into one wave; otherwise the cap. The cap of 8 left H=8192
// rank 64 at T=2048 in 1.37 waves, whose partial second wave lands unevenly on the SMs (ncu per
// launch: busiest SM 1.05-1.18x the average); a cap of 16 everywhere cost the Llama-3-8B mixed-rank
// layers up to 1.12 where it lengthened blocks without reaching one wave or in the dual kernel
// (results/NOTES.md v31 part 3), so this rule takes the longer blocks only where they make one wave,
// and not in the dual kernel. Measured on the H200 (bench A/B against 5a9c24f, 3 interleaved rounds,
// results/NOTES.md v32 part 1, back to back / cold): H=8192 rank 64 T=2048 expand with 1 / 8 / 32
// adapters 30.86 -> 26.98 us (0.87 / 0.89), 0.84 / 0.85, 0.81 / 0.90; add_lora_linear 0.91-0.94;
// the other 34 T=2048 bench cases 0.995-1.006 (cold 0.99-1.02); the 16 Llama-3-8B prefill layers
// 0.997-1.004 (cold 0.98-1.01, one round).
constexpr int kPipeTiles64OneWave = 16;
// Column tiles per block for the pipelined kernels: the smallest count that fits the batch's tiles
// into one wave of `slots` resident blocks, at most max_ntb; above that, up to one_wave_max (0: off)
// where every working block then fits into one wave. round_spill: also where the count within the
// cap spills past one wave through each slice's rounding, up to one_wave_max tiles if one of them
// fits one wave. col_tiles: each slice's column tiles; token_tiles: the working token tiles
// (pipe_token_tiles).
inline int pipe_ntb(const int64_t* col_tiles, int num_slices, int64_t token_tiles, int64_t slots, int max_ntb,
                    int one_wave_max, bool round_spill = false) {
  int64_t ct = 0;
  for (int s = 0; s < num_slices; ++s) ct += col_tiles[s];
  slots = std::max<int64_t>(1, slots);
  const int64_t want = (ct * token_tiles + slots - 1) / slots;
  const int fit = int(std::max<int64_t>(1, std::min<int64_t>(max_ntb, want)));
  const auto blocks_of = [&](int m) {
    int64_t b = 0;
    for (int s = 0; s < num_slices; ++s) b += (col_tiles[s] + m - 1) / m;
    return b * token_tiles;
  };
  const bool spill = want > max_ntb || (round_spill && blocks_of(fit) > slots);
  if (spill)
    for (int m = fit + 1; m <= one_wave_max; ++m)
      if (blocks_of(m) <= slots) return m;
  return fit;
}

// Two or more slices at rank <= 16: at most 3 column tiles per block. Measured (results/NOTES.md v17
// part 1, 2xH200 host, with the one-round tile lookup): the Llama-3-8B qkv tp2 layer's LoRA part
// 52.2-52.4 -> 51.1-51.4 us, qkv tp1 72.5-72.9 -> 71.8-72.1, gate_up (2 slices) 214.1-214.3 ->
// 214.9-215.4 (tp1, +0.5%) and 122.1-122.7 -> 122.2-122.6 (tp2); the bench's T=8192 3-slice
// r=16 expands and add_lora_linear within -1.2..+0.5 us. One slice keeps 4 (v11: T=2048, one
// adapter, 10.9 -> 11.7 us with 3).
inline int pipe_tiles16(int num_slices) { return num_slices >= 2 ? 3 : kPipeTiles16; }

// Token tiles of BM rows that the pipelined kernel's blocks will find, estimated on the host for
// its tiles-per-block choice (ntb = the smallest count that fits the tiles into one wave of
// resident blocks, capped as above). Each adapter's tokens start a new tile, so with T tokens spread
// evenly over min(max_loras, T) adapters (every slot active: the host cannot read the metadata, and
// small_bm assumes the same) that is min(L, T) * ceil(ceil(T / min(L, T)) / BM), never fewer than
// ceil(T / BM). Until v26 the count was ceil(T / BM), which is exact for one adapter but with many
// adapters of few tokens each undercounts the tiles up to L-fold: H=8192 r=16, 32 adapters, T=256
// (8 tokens each) took one column tile per block, 2048 one-tile blocks in ~4 waves, and T=64 at
// rank 64 (16-row tiles, 2 tokens per adapter) 2048 blocks in ~5 waves, slower than T=256 there.
// Measured on the H200 (bench A/B, exp/pipe-ntb against 5771315, T=64 / 256, 3 interleaved rounds,
// results/NOTES.md v26 part 2, back to back / cold): expand 32 adapters r=64 T=64 H=8192 19.56 ->
// 13.35 us (0.68 / 0.75), qkv 0.67 / 0.74, H=4096 0.75 / 0.81; r=16 T=256 H=8192 15.81 -> 11.60
// (0.73 / 0.78); 25 of the 80 cases faster (0.67-0.97: also 8 adapters of rank 64 and mixed ranks,
// add_lora_linear 0.82-0.97), the other 55 at 0.99-1.01.
inline int64_t pipe_token_tiles(int64_t T, int64_t max_loras, int bm) {
  if (T <= 0) return 0;
  const int64_t l = std::max<int64_t>(1, std::min<int64_t>(max_loras, T));
  const int64_t per = (T + l - 1) / l;
  return std::max((T + bm - 1) / bm, l * ((per + bm - 1) / bm));
}

// The mma kernels' shape preconditions (16-bit B and y, 16-byte B rows).
inline bool mma_shape_ok(DType dtype, int max_rank, bool b_aligned) {
  return dtype != DType::f32 && max_rank % 8 == 0 && b_aligned;
}
inline bool use_mma(DType dtype, int64_t T, int max_rank, bool b_aligned) {
  return mma_shape_ok(dtype, max_rank, b_aligned) && T > kDecodeMaxTokens;
}
// Decode-sized batches (16 <= T <= 128) with several tokens per adapter (T / max_loras, the host's
// bound) also take the mma kernels: the decode kernel reads B once per token, they read it once
// per token tile. Measured on the H200 (LoraExpandPerf, results/NOTES.md v8, back to back): one
// slice H=8192 r=64, one adapter, T=64: 5.7 us against 30.4; 8 adapters: 8.6 against 25.1;
// one slice r=16, T=64, 8 adapters: 4.3 against 5.6; but (until v26, below) one or two tokens per
// adapter stayed with the decode kernel (r=16, 32 adapters, T=64: 7.4 against 8.6), as r=16 below
// 8 tokens per adapter (T=32, 8 adapters: cold 8.1 against 8.6) and T=16 at r=16 (3.6 against 3.7).
// Above rank 16 two tokens per adapter suffice from T=16 on (until v25 only from T=64): since the
// 16-row token tiles (v20) the mma kernels win there too (bench A/B, results/NOTES.md v25 part 2,
// back to back: 8 adapters r=64 at T=16, H=8192 9.40 -> 6.12 us, H=4096 5.56 -> 4.67; mixed ranks
// 8/16/64 qkv 7.43 -> 5.59; add_lora_linear H=8192 13.98 -> 10.33).
// At rank <= 16 two tokens per adapter suffice from T=64 on (v26): with the tiles-per-block estimate
// that counts a tile per adapter (pipe_token_tiles) and 16-row tiles for few tokens per adapter
// (pipe16_few), the mma kernel reads each adapter's B once where the decode kernel re-reads it per
// token. Measured (bench A/B, exp/v2-mma-many against e1b69b4, 3 / 2 interleaved rounds,
// results/NOTES.md v26 part 4, back to back / cold), 32 adapters of rank 16: T=128 (axis override)
// expand H=8192 17.10 -> 7.34 us (0.43 / 0.57), H=4096 0.49 / 0.68, qkv 0.55 / 0.69,
// add_lora_linear 0.45-0.55 / 0.49-0.65; T=64 expand H=8192 9.32 -> 7.02 (0.75 / 0.77), qkv 0.92 /
// 0.84, H=4096 0.94 / 0.87, add_lora_linear 0.82-0.95; but T=32 (one token per adapter) 1.12-1.53x
// slower, hence T >= 64 and tpa >= 2.
constexpr int64_t kMma16ManyMinTokens = 64;
inline bool small_batch_mma(int64_t T, int max_loras, int max_rank) {
  if (T < 16 || T > kDecodeMaxTokens) return false;
  const int64_t tpa = T / std::max(1, max_loras);
  if (max_rank <= 16) return (T >= 32 && tpa >= 8) || (T >= kMma16ManyMinTokens && tpa >= 2);
  return tpa >= 2;
}
// In small batches above rank 16 the streaming kernel (one tile per block, more blocks) beats the
// pipelined one (8 tiles per block), up to 512 tokens (LoraExpandPerf, back to back): H=8192 r=64,
// 8 adapters, T=64: 8.6 against 13.1 us; T=256: 9.3 against 13.1; qkv r=64, 32 adapters, T=256:
// 23.8 against 34.4; T=512: 25.0 against 26.0; from T=1024 not (32 adapters: 33.4 against 31.0).
constexpr int64_t kStreamMaxTokens = 512;
inline bool prefer_stream(int64_t T, int max_rank) { return T <= kStreamMaxTokens && max_rank > 16; }
// ... except one adapter at 16-48 tokens (rank 17-64, a standalone expand: add_lora_linear's
// expand behind its shrink keeps its own rule): the pipelined 64 x 64 kernel, whose few blocks
// each stream several column tiles of B, beats the streaming kernel's 16-row tiles. Measured on the
// H200 (bench A/B by axis override, one adapter, 3 interleaved rounds, back to back / cold;
// results/NOTES.md v34 part 1): qkv r=64 T=16 / 24 / 32 / 48 0.80 / 0.88 / 0.88 / 0.88 (T=16:
// 4.07 -> 3.28 us), one slice r=64 H=4096 0.89-0.95, H=8192 0.89-0.91 to T=32 and 1.01 at T=48;
// cold 0.92-0.98; add_lora_linear T=16 / 24 (its small-batch path calls this expand) 0.87-0.95. Not
// at T=64 (1.04-1.17), nor with 8 adapters (T=16 / 64 1.03-1.56; qkv T=256 0.92 but T=96-192
// 1.08-1.22), nor below 16 tokens (the decode kernel's region: T=1-4 up to 2x slower).
// It counts slots (max_loras), not the caller's num_active_loras: the pipelined grid has a row of
// blocks per slot (ceil(T / 64) + max_loras + 1 rows), and one adapter hinted in 32 slots measured
// 0.75-0.88 for qkv but up to 1.10 for one slice (T=16 1.08-1.10; bench_sparse_slots, same A/B).
constexpr int64_t kOnePipeMinTokens = 16, kOnePipeMaxTokens = 48;
inline bool one_adapter_pipe(int64_t T, int max_rank, int64_t max_loras) {
  return max_loras == 1 && max_rank > 16 && max_rank <= 64 && T >= kOnePipeMinTokens && T <= kOnePipeMaxTokens;
}
// Token rows per block of the pipelined (rank <= 16) and streaming kernels with an fp32 x: 64, or
// 32 / 16 where 64-row tiles leave most SMs idle (small batches: T=64 one adapter at H=4096 is 32
// blocks of 64 x 128). The largest of 64 and 32 whose estimated blocks (column tiles x token tiles,
// a partial tile per adapter) reach 4 per SM with several adapters (2 with one), else 16 up to 128
// tokens and 32 above. Measured on the H200 (results/NOTES.md v20 parts 2 and 4):
// - 2 per SM (exp/expand-smallbm against d61273d, bench_lora_ops T=16-256 and T=32 / 128 by axis
//   override, 2 interleaved rounds): the cases that gained 0.81-0.94 back to back and 0.86-0.95
//   cold (one slice r=64, one adapter, T=64: 7.07 -> 5.75 us; qkv r=64 T=128: 8.46 -> 6.98), inside
//   add_lora_linear 0.89-0.94; no case above 1.02.
// - 4 per SM with several adapters (exp/linear-small-pdl against b0cf3f6, T=64 / 256 / 512): 8
//   adapters 0.82-0.96 (qkv r=64 T=64: 9.45 -> 7.77 us), every other case 0.97-1.03. With one adapter
//   4 per SM lost 1.06-1.44x at T=256 (16-row tiles: B re-read per tile) and 32-row tiles lost
//   1.06-1.25x at T=512, hence 2 per SM there and no 16-row tiles above 128 tokens
//   (except many adapters of few tokens each at rank <= 16: pipe16_few below).
// fp32 x only (the intermediate of add_lora_linear and of the bench), so that the 16-bit-x variants
// are not instantiated.
constexpr int kSmallBmBlocksPerSm = 4;     // with >= 2 adapters
constexpr int kSmallBmBlocksPerSmOne = 2;  // with one adapter
constexpr int64_t kSmallBm16MaxTokens = 128;
inline int small_bm(int64_t T, int64_t max_loras, int64_t col_tiles, int num_sms) {
  const int64_t want = int64_t(max_loras >= 2 ? kSmallBmBlocksPerSm : kSmallBmBlocksPerSmOne) * num_sms;
  for (int bm : {64, 32}) {
    const int64_t tiles = (T + bm - 1) / bm + std::min<int64_t>(std::max<int64_t>(max_loras, 1), T) - 1;
    if (col_tiles * tiles >= want) return bm;
  }
  return T <= kSmallBm16MaxTokens ? 16 : 32;
}
// Rank <= 16 above 128 tokens with several adapters of at most 16 tokens each on average: 16-row
// tiles in the pipelined kernel (small_bm's one-adapter loss at T=256 came from B re-read per
// tile; here each adapter's tokens fill one tile at any height, so B is read once per adapter
// either way), staging 16 instead of 64 y rows per tile (~21 against ~49 KB of shared memory,
// expand_stream::PipeLayout). Both builds take 64 registers at 256 threads (ptxas), i.e. 4 blocks
// per SM either way, so the gain is not more resident blocks; what it is was not profiled.
// Measured on the H200 (bench A/B, exp/pipe16-few against 994ed0a, results/NOTES.md v26 part 3,
// back to back / cold): 32 adapters T=256 expand H=8192 11.52 -> 8.16 us (0.71 / 0.79), qkv 0.76 /
// 0.82, H=4096 0.83 / 0.87, add_lora_linear 0.78-0.88; T=384 / 512 (axis override) expand
// 0.78-0.96, add_lora_linear 0.85-0.91; every other case 0.987-1.006.
constexpr int64_t kPipe16FewMaxTokensPerLora = 16;
// From v26 part 4 also up to 128 tokens, where small_bm would take 64 or 32 rows because the
// estimated partial tiles of many adapters fill the grid (32 adapters at T=64 / 128; 8 adapters
// at T=128 H=8192 add_lora_linear 12.11 -> 11.45 us, the rest 0.98-1.02).
inline bool pipe16_few(int64_t T, int64_t max_loras) {
  return max_loras >= 2 && T <= kPipe16FewMaxTokensPerLora * max_loras;
}
// The rank <= 16 kernel with 16-row token tiles (pipe16_few's several adapters of at most 16 tokens
// each, or small_bm's 16 rows) where the wave fit's count spills past one wave only through each
// slice's rounding: up to kPipeTiles16 tiles per block (pipe_ntb's round_spill) if that makes one
// wave, and only where the caller passed num_active_loras. The qkv shape at T=256 with 32 adapters
// of rank 16 (32 token tiles, column tiles 32 / 8 / 8) takes 3 tiles per block, 17 x 32 = 544
// blocks on 528 slots; 4 tiles give 12 x 32 = 384. Measured without the hint condition
// (results/NOTES.md v32 parts 3-5, H200, back to back / cold): with 32 real adapters that expand
// 8.47 -> 7.14 us (0.84 / 0.90-0.92), at T=64 0.85 / 0.87, add_lora_linear 0.93-0.95; but with 1-8
// adapters in 32 slots, whose host count is the same (every slot), 1.09-1.37x slower
// (add_lora_linear 1.01-1.10x): the few real tiles fit one wave anyway and 4 tiles per block only
// lengthen them. With the hint the host's count is the real one.
// Measured with the hint condition (NOTES v33 part 1, H200, 3 rounds, the bench's 80 T=64 / 256
// expand and add_lora_linear cases with active_loras_hint): that qkv expand 7.96 -> 6.74 us (T=64,
// 0.85 / 0.88 cold) and 8.43 -> 7.15 (T=256, 0.85 / 0.92), add_lora_linear 0.93 / 0.95; the other
// 76 cases 0.98-1.01; the sparse-slot bench (1-8 adapters in 32 slots, plain and hinted) 0.98-1.02.
// The 64-row tiles' rounding spill (qkv r=16 at T=2048: 544 -> 384 blocks) measured 1.02-1.03
// slower back to back (cold 0.93-0.99): not taken there.
constexpr int kPipe16FewOneWave = kPipeTiles16;
// After add_lora_linear's shrink (a programmatic dependent launch) the pipelined kernel overlaps the
// shrink's tail, which the streaming kernel's ordinary launch does not: it stays there except with
// under 16 tokens per adapter. Measured (bench_lora_ops, back to back, streaming at git 3f6770a
// against pipelined at 29a41fe and d79c88a), T=256 r=64: one adapter 15.6 against 13.4 us, 8 adapters
// 17.9 against 16.9 (H=8192: 22.4 against 22.8), 32 adapters 31.8 against 37.4 (qkv: 50.8 against
// 56.5; H=8192: 48.4 against 48.7).
constexpr int64_t kPipeAfterShrinkMinTokensPerLora = 16;
inline bool prefer_stream_after_shrink(int64_t T, int max_rank, int64_t max_loras) {
  return prefer_stream(T, max_rank) && T < kPipeAfterShrinkMinTokensPerLora * max_loras;
}

// Few tokens per adapter above rank 16 (T <= 16 * max_loras, the host's bound; rank <= 64, fp32 x,
// 64-512 tokens): where the streaming kernel would run, the pipelined kernel with 16-row token
// tiles and 128-column tiles, 3 stages (B of the next column tile in flight while one is
// multiplied): the streaming kernel's blocks each load one B tile behind their metadata chain, and
// with many adapters B is nearly all the bytes. Measured on the H200 (variant 11 of branch
// exp/pipe-variants and its perf tests there, results/NOTES.md v22, graph / cold against auto):
// - LoraExpandPerf.DISABLED_PipeSmall, rank 64: 32 adapters T=64 0.66-0.69 / 0.69-0.73, T=256
//   0.52-0.59 / 0.63-0.69 (H=8192: 28.9 -> 15.2 us); 8 adapters T=64 0.78-0.93 / 0.78-0.96. Not at
//   32 tokens per adapter (8 adapters T=256: 0.92-1.35 in a graph) nor T=1024.
// - DISABLED_PipeSmall16, 16 tokens per adapter (T=512 / 32 adapters, T=256 / 16, T=128 / 8) and 4
//   (T=128 / 32): rank 64 0.55-0.79 / 0.63-0.81, rank 32 0.72-0.98 / 0.72-0.89.
// - Bench A/B (bench_lora_ops T=64 / 256 at rank 64 and mixed ranks, 2 interleaved rounds):
//   lora_expand 0.57-0.82 back to back where taken (H=8192 32 adapters T=256: 30.1 -> 17.3 us),
//   add_lora_linear 0.65-0.91 (48.0 -> 31.4 us); every other case 0.98-1.02. At 12 and 15 per
//   adapter (T=384 / 480, 32 adapters, axis override, 3 rounds, against the rule's 8-per-adapter
//   version): lora_expand 0.53-0.67, add_lora_linear 0.69-0.74.
// Below 64 tokens not measured: the streaming kernel stays.
constexpr int64_t kPipeFewMaxTokensPerLora = 16;
constexpr int64_t kPipeFewMinTokens = 64;
constexpr int kPipeFewTiles = 8;
inline bool pipe_few_tokens(int64_t T, int max_rank, int64_t max_loras) {
  return max_rank > 16 && max_rank <= 64 && T >= kPipeFewMinTokens && T <= kStreamMaxTokens &&
         T <= kPipeFewMaxTokensPerLora * max_loras;
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
// Column width of a per-token block at rank <= 16. The narrow blocks (64 columns) spread a T=1 call
// over the SMs, but from a few tokens on they make thousands of short blocks whose fixed cost (slot,
// rank, B's first load) is the time: H=8192 T=64 is 8192 blocks. Past kDecWideMinBlocks narrow
// blocks a block takes kDecWideFactor times the columns (256), the same per-column arithmetic.
// Measured on the H200 (bench_lora_ops, back to back, median of 2 interleaved runs, results/NOTES.md
// v13): expand T=64 32 adapters 7.9 -> 7.4 us (H=4096), 14.5 -> 11.7 (H=8192); qkv T=16 one adapter
// 3.5 -> 2.7, T=64 32 adapters 11.4 -> 9.0; add_lora_linear 0.88-0.95 of its time there; T=1 and
// T=256 unchanged. At rank 17-64 the same 4x (128 columns, 8 B rows per lane in registers) was
// 1.2-1.35x slower (T=16 8 adapters: 5.6 -> 6.7 us), so those blocks stay narrow.
constexpr int64_t kDecWideMinBlocks = 1024;  // 8 blocks per SM of 132
constexpr int kDecWideFactor = 4;
// Columns of a narrow per-token block at rank <= 16: 4 warps x 32 / G lanes x UNR (expand_decode.cu's
// launch_t: G = 2, UNR = 1).
constexpr int kDecNarrowCols16 = 64;
inline bool decode_wide(int64_t T, const int64_t* widths, int S, int max_rank) {
  if (max_rank > 16) return false;
  int64_t chunks = 0;
  for (int s = 0; s < S; ++s) chunks += (widths[s] + kDecNarrowCols16 - 1) / kDecNarrowCols16;
  return T * chunks > kDecWideMinBlocks;
}
// The per-token decode kernel's build held to more blocks per SM (expand_decode.cu, dec_min_blocks)
// where its grid then runs in fewer waves than the plain build's: `wave_*` are the blocks each
// build keeps resident on the device. Measured on the H200 (bench A/B against 30d9197, T <= 64, 3
// interleaved rounds, back to back, results/NOTES.md v24 part 4): expand T=64 32 adapters r=16
// H=4096 6.72 -> 4.99 us (1024 blocks: 2 waves -> 1), H=8192 11.06 -> 9.14 (2048: 3 -> 2),
// add_lora_linear there 0.81 / 0.88; rank 64 at T=16 with 8 / 32 adapters 0.89-0.97; every other
// case 0.98-1.02. Held everywhere (a first build) it was 1.04-1.12x slower where the waves stay
// the same (expand T=1 rank 64; add_lora_linear qkv T=16 rank 16 behind the decode shrink).
inline bool decode_fewer_waves(int64_t blocks, int wave_plain, int wave_occ) {
  const auto waves = [&](int w) { return (blocks + std::max(w, 1) - 1) / std::max(w, 1); };
  return waves(wave_occ) < waves(wave_plain);
}
// The older wide-N GEMV (blocks per adapter, a token loop) stays faster for T >= 64 with 4..16
// tokens per adapter (H200, T=64, 8 adapters: 7.0 vs 8.2 us at H=4096 r=16, 22.4 vs 33.3 us at
// H=8192 r=64); with 1 or 32 adapters it is 1.1-3x slower than the decode kernel.
inline bool decode_use_gemv(int64_t T, int max_loras) {
  return T >= 64 && T >= 4 * int64_t(max_loras) && T <= 16 * int64_t(max_loras);
}

}  // namespace punica::kernels::expand_heur

namespace punica::kernels {

// ---------------------------------------------------------------- the plan
// One call's kernel and its configuration (expand_heur::plan; lora_expand_plan fills the inputs
// from the Args and the current device). The launcher runs exactly this plan; only the pipelined
// kernels' column tiles per block (pipe_ntb, up to max_ntb) are fitted at launch to the resident
// blocks the occupancy API reports.
// Kinds (ExpandPrefillKernel, `--kernel expand=`): all three are taken by the automatic choice
// (staged for layouts the others cannot read), so all are kept.
enum class ExpandPath {
  none,       // nothing to do (T = 0, no slots, no columns)
  decode,     // expand_decode.cu, one block per token (its own grid choice)
  gemv,       // the wide-N GEMV (lora_expand.cu)
  staged,     // the staged mma kernel (any layout)
  stream,     // the streaming mma kernel (any rank), bm-token tiles
  pipe,       // the pipelined mma kernel, bm x bn tiles over rank chunks of bk
  pipe_dual   // the pipelined kernel with each block's tiles by its adapter's true rank (fp32 x)
};
struct ExpandPlan {
  ExpandPath path = ExpandPath::none;
  ExpandPrefillKernel kind = ExpandPrefillKernel::automatic;  // the prefill kernel (automatic: none)
  int bm = 64, bn = 128, bk = 16;  // stream / pipe tile (pipe_dual: 64 x 64)
  int ks = 1;                      // stream: rank chunks in shared memory (stream_chunks)
  int max_ntb = 1;                 // pipe: column tiles per block at most
  int one_wave_max = 0;            // pipe: longer blocks where they make one wave (0: off)
  bool round_spill = false;        // pipe: pipe_ntb's round_spill
};
// What the choice reads of one call (lora_expand_plan fills it from LoraExpandArgs).
struct ExpandShape {
  DType in_dtype = DType::f32, dtype = DType::bf16;
  int64_t T = 0;
  int S = 1, R = 0, L = 0;
  int planned = 0;          // planned_loras(L, num_active_loras)
  bool hinted = false;      // num_active_loras > 0
  bool has_columns = true;  // some slice has width > 0
  bool b_vec = false;       // expand_b_vec_ok: 16-byte B rows
  bool fast = false;        // the streaming / pipelined kernels' layout preconditions (fast_ok)
  int64_t col_tiles128 = 0; // 128-column tiles over all slices
};

namespace expand_heur {
// The prefill kernel (automatic = none: the decode kernel or the GEMV); few: the pipelined kernel
// with 16-row tiles where the automatic choice would take the streaming kernel (pipe_few_tokens).
// pdl: add_lora_linear's expand behind its shrink.
struct PrefillChoice {
  ExpandPrefillKernel kind;
  bool few = false;
};
inline PrefillChoice choose_prefill(const ExpandShape& s, ExpandPrefillKernel which, bool pdl) {
  using K = ExpandPrefillKernel;
  const int lh = s.planned;
  if (s.dtype == DType::f32 || !mma_shape_ok(s.dtype, s.R, s.b_vec)) return {K::automatic};
  const bool mma = which != K::automatic || small_batch_mma(s.T, lh, s.R) || s.T > kDecodeMaxTokens;
  if (!mma) return {K::automatic};
  if (which == K::mma_staged || !s.fast) return {K::mma_staged};
  // After add_lora_linear's shrink (pdl) the pipelined kernel mostly stays: its y and B loads
  // overlap the shrink's tail (prefer_stream_after_shrink).
  const bool stream = which == K::automatic && (pdl ? prefer_stream_after_shrink(s.T, s.R, lh)
                                                    : prefer_stream(s.T, s.R) && !one_adapter_pipe(s.T, s.R, s.L));
  if (stream && s.in_dtype == DType::f32 && pipe_few_tokens(s.T, s.R, lh)) return {K::mma_pipe, true};
  const bool pipe_ok = which != K::mma_stream && !stream;
  return {pipe_ok && (s.R <= 64 || pipe128_ok(s.in_dtype, s.R)) ? K::mma_pipe : K::mma_stream};
}

inline ExpandPlan plan(const ExpandShape& s, ExpandPrefillKernel which, bool pdl, int num_sms) {
  using K = ExpandPrefillKernel;
  ExpandPlan p;
  if (s.T == 0 || s.L == 0 || !s.has_columns) return p;
  const int lh = s.planned;
  auto pipe = [&](int bm, int bn, int bk, int max_ntb, int one_wave_max = 0, bool round_spill = false) {
    p.path = ExpandPath::pipe;
    p.bm = bm, p.bn = bn, p.bk = bk, p.max_ntb = max_ntb, p.one_wave_max = one_wave_max, p.round_spill = round_spill;
    return p;
  };
  auto stream = [&](int bm) {
    p.path = ExpandPath::stream;
    p.bm = bm, p.bn = 128, p.bk = 32, p.ks = stream_chunks(s.R);
    return p;
  };
  if (s.dtype != DType::f32) {
    const PrefillChoice choice = choose_prefill(s, which, pdl);
    const K kind = choice.kind;
    p.kind = kind;
    if (s.in_dtype == DType::f32) {  // small batches: 32 / 16 token rows per block
      if (choice.few) return pipe(16, 128, 64, kPipeFewTiles);
      if (which == K::automatic && (kind == K::mma_stream || (kind == K::mma_pipe && s.R <= 16))) {
        const int bm = kind == K::mma_pipe && pipe16_few(s.T, lh) ? 16 : small_bm(s.T, lh, s.col_tiles128, num_sms);
        if (kind == K::mma_pipe) {
          // kPipe16FewOneWave: up to 4 tiles where the rounding spills past one wave, only where the
          // caller counted the active adapters (num_active_loras)
          if (bm == 16) return pipe(16, 128, 16, pipe_tiles16(s.S), kPipe16FewOneWave, s.hinted);
          if (bm == 32) return pipe(32, 128, 16, pipe_tiles16(s.S));
        } else {
          if (bm == 16) return stream(16);
          if (bm == 32) return stream(32);
        }
      }
    }
    switch (kind) {
      case K::mma_pipe:
        if (s.R <= 16) return pipe(64, 128, 16, pipe_tiles16(s.S));
        if (s.R > 64) return pipe(64, 64, kPipe128MaxRank, kPipeTiles64, kPipeTiles64OneWave);  // pipe128_ok
        // From 4096 tokens (fp32 x): each block's tiles by its adapter's true rank (pipe_dual).
        if (s.in_dtype == DType::f32 && pipe_dual(s.T)) {
          pipe(64, 64, 64, kPipeTiles64);
          p.path = ExpandPath::pipe_dual;
          return p;
        }
        return pipe(64, 64, 64, kPipeTiles64, kPipeTiles64OneWave);
      case K::mma_stream: return stream(64);
      case K::mma_staged: p.path = ExpandPath::staged; return p;
      case K::automatic: break;
    }
  }
  p.kind = K::automatic;
  p.path = s.R <= kDecMaxRank && !decode_use_gemv(s.T, lh) ? ExpandPath::decode : ExpandPath::gemv;
  return p;
}
}  // namespace expand_heur

}  // namespace punica::kernels
