// Launch heuristics of the per-row mat-vec (add_lora_logits' shrink, apply_lora_full_linear) and
// the logits expand tile, beside (not inside) the kernels. OPB = outputs per block: larger reuses
// each x load for more weight rows; smaller makes more blocks when rows x outputs is small.
#pragma once
#include <cstdint>
#include "kernels/add_lora_embedding/heuristics.h"

namespace punica::kernels {

inline int pick_row_dot_opb(int64_t rows, int max_outputs, int sms) {
  for (int opb = 8; opb > 1; opb /= 2)
    if (rows * ((max_outputs + opb - 1) / opb) >= 2 * int64_t(sms) && max_outputs >= opb) return opb;
  return 1;
}

}  // namespace punica::kernels
