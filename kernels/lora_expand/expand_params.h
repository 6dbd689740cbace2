// The fields every lora_expand kernel reads (the GEMV and staged kernels of lora_expand.cu, the
// stream / pipe kernels of expand_stream.cuh, the decode kernel of expand_decode.cu), filled once
// from LoraExpandArgs, and the 16-byte test on B they share.
#pragma once
#include <algorithm>
#include <cstdint>
#include "kernels/common/lora_types.h"
#include "kernels/lora_expand/lora_expand.h"

namespace punica::kernels {

struct ExpandCore {
  const void* x;  // [S, T, R] of the input dtype (or add_lora_linear's fp32 partials)
  const void* b[kMaxSlices];
  int64_t n[kMaxSlices];
  int64_t col[kMaxSlices];  // first output column of each slice (offset_start included)
  int64_t T;
  int S, L, R;
  int E;  // metadata entries that can hold tokens: planned_loras + 1 (the -1 entry); host-side grid
          // bounds only (the device lookups scan all L + 1 entries: the entries past E hold no tokens)
  const int32_t* ranks;
  LoraMetaView meta;
  void* y;
  int64_t ldy;
  int add;
};

inline ExpandCore expand_core(const LoraExpandArgs& a) {
  ExpandCore p{};
  p.x = a.x;
  int64_t c = a.offset_start;
  for (int s = 0; s < kMaxSlices; ++s) {
    p.b[s] = a.lora_b[s];
    p.n[s] = s < a.num_slices ? a.slice_width[s] : 0;
    p.col[s] = c;
    c += p.n[s];
  }
  p.T = a.num_tokens;
  p.S = a.num_slices;
  p.L = a.max_loras;
  p.E = planned_loras(a.max_loras, a.num_active_loras) + 1;
  p.R = a.max_rank;
  p.ranks = a.lora_ranks;
  p.meta = a.meta;
  p.y = a.y;
  p.ldy = a.y_row_stride ? a.y_row_stride : c;  // default: the rows end at the last slice
  p.add = a.add_inputs ? 1 : 0;
  return p;
}

// The widest slice.
inline int64_t expand_max_width(const ExpandCore& p) {
  int64_t m = 0;
  for (int s = 0; s < kMaxSlices; ++s) m = std::max(m, p.n[s]);
  return m;
}

// B rows can be read in 16-byte vectors (max_rank % 8 == 0, aligned slice bases).
inline bool expand_b_vec_ok(const LoraExpandArgs& a) {
  if (a.max_rank % 8 != 0) return false;
  for (int s = 0; s < a.num_slices; ++s)
    if (!aligned16(a.lora_b[s])) return false;
  return true;
}

}  // namespace punica::kernels
