// The fields every lora_shrink kernel reads (the kernels of shrink_legacy.cu, shrink_fused.cu and
// shrink_decode.cu / shrink_cluster.cu), filled once from LoraShrinkArgs, and the 16-byte-load test
// they share.
#pragma once
#include <cstdint>
#include "kernels/common/lora_types.h"
#include "kernels/lora_shrink/lora_shrink.h"

namespace punica::kernels {

struct ShrinkCore {
  const void* x;
  int64_t x_stride;
  const void* a[kMaxSlices];
  int64_t T, K;
  int S, L, R;
  int E;  // metadata entries that can hold tokens: planned_loras + 1 (the -1 entry); host-side grid
          // bounds only (the device lookups scan all L + 1 entries: the entries past E hold no tokens)
  const int32_t* ranks;
  LoraMetaView meta;
  float scale;
  void* y;  // [S,T,R] (atomic/store) or [nsplit,S,T,R] partials
};

inline ShrinkCore shrink_core(const LoraShrinkArgs& a) {
  ShrinkCore p{};
  p.x = a.x;
  p.x_stride = a.x_row_stride ? a.x_row_stride : a.hidden;
  for (int s = 0; s < kMaxSlices; ++s) p.a[s] = a.lora_a[s];
  p.T = a.num_tokens;
  p.K = a.hidden;
  p.S = a.num_slices;
  p.L = a.max_loras;
  p.E = planned_loras(a.max_loras, a.num_active_loras) + 1;
  p.R = a.max_rank;
  p.ranks = a.lora_ranks;
  p.meta = a.meta;
  p.scale = a.scale;
  p.y = a.y;
  return p;
}

// The legacy and fused kernels' parameters: ShrinkCore plus their launch configuration.
struct ShrinkParams : ShrinkCore {
  int kc, nsplit, nrowblk;      // GEMV
  int nrc, ktiles_per_split;    // mma, fused
  int stream_k;                 // fused: 1 = stream-K ranges over a grid of resident blocks
};

// x rows and every slice's A rows can be read in 16-byte vectors.
inline bool shrink_vec_ok(const LoraShrinkArgs& a, const ShrinkCore& p) {
  if (p.K % 8 != 0 || p.x_stride % 8 != 0 || !aligned16(a.x)) return false;
  for (int s = 0; s < a.num_slices; ++s)
    if (!aligned16(a.lora_a[s])) return false;
  return true;
}

}  // namespace punica::kernels
