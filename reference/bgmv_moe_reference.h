// CPU reference of FlashInfer's MoE LoRA deltas (kernels/bgmv_moe_lora_delta; SPEC §4.8.4-4.8.5,
// A.7) on HOST pointers: the pointer tables hold host addresses. Semantics as the kernels: x / act
// and the weights in lora_dtype, the rank-r intermediate rounded to lora_dtype, the delta summed in
// fp32 (gemm2: over the token's slots, times the routing weight), times scale, rounded once to
// out_dtype; rows without a contribution exactly 0; only each slot's true rank is read. naive::
// holds independent fp64 loops that check the Eigen path.
#pragma once
#include "kernels/bgmv_moe_lora_delta/bgmv_moe_lora_delta.h"

namespace punica::ref {

void bgmv_moe_gemm1_lora_delta(const kernels::BgmvMoeGemm1Args& a);
void bgmv_moe_gemm2_lora_delta(const kernels::BgmvMoeGemm2Args& a);

namespace naive {
void bgmv_moe_gemm1_lora_delta(const kernels::BgmvMoeGemm1Args& a);
void bgmv_moe_gemm2_lora_delta(const kernels::BgmvMoeGemm2Args& a);
}  // namespace naive

}  // namespace punica::ref
