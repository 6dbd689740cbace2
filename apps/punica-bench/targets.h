// `punica-bench targets`: the performance targets of the kernel and layer issues, evaluated on
// result documents (punica-bench.result/1) as the issues define them, so that a dashboard or a
// closing note reads them from one command instead of recomputing them by hand.
//
// Op cases (lora_shrink, lora_expand, add_lora_linear; status pass, timed; issue 47's targets, which
// replaced issue 3's floor fractions):
//   dense_prefill       work.floor_us >= 10: metrics.copy_fraction >= 0.75, or, where the FLOP term
//                       (work.flops over run.ceilings.gemm_bf16_tflops) exceeds the floor, that term
//                       over the cold median >= 0.7;
//   dense_decode        work.floor_us < 10: metrics.copy_batch_fraction >= 0.5;
//   one_adapter_expand  lora_expand with one slice and one adapter (params.num_slices, num_adapters):
//                       cold median <= 1.03 x baseline.cublas_us (cuBLAS's accumulating GEMM);
//   linear_chain  add_lora_linear faster than lora_shrink + lora_expand of the same shape (the case
//                 id with its op segment removed), cold (timing.time_us.median) and back to back.
// Layer cases (op "layer"; status pass, timed):
//   prefill_floor  LoRA part at >= 0.80 of its floor (metrics.lora_floor_fraction) for prefill qkv
//                  and gate_up, 8192 tokens, 8 adapters, rank 16, tp 1 and 2, plain;
//   fully_sharded  a fully sharded tp-2 layer's LoRA part <= 1.1 x (the plain tp-2 layer's LoRA part +
//                  the sharded LoRA's collectives, timing.comm_*_us but not the base layer's
//                  comm_base_*);
//   decode_gather  decode, fully sharded, tp 2: the all_gather in a CUDA graph
//                  (timing.comm_all_gather_batch_us) <= 15 us.
// MoE op cases (moe_lora_align, add_lora_fused_moe, add_lora_w13, add_lora_w2; issue 44; and
// FlashInfer's bgmv_moe_gemm1_lora_delta / bgmv_moe_gemm2_lora_delta, issue 45: moe_prefill, moe_decode):
//   moe_prefill    work.floor_us >= 10: metrics.copy_fraction >= 0.7, or, where the FLOP term
//                  (work.flops over run.ceilings.gemm_bf16_tflops) exceeds the floor, that term over
//                  the cold median >= 0.7;
//   moe_decode     work.floor_us < 10: batch_time_us <= graph node x kernels launched
//                  (timing.batch_nodes_per_call: the batch graph's nodes per call, memsets
//                  included; files without it: 2 for add_lora_w13's aligned path, the deltas 2 on
//                  the pairs path, 3 / 4 on gemm1's / gemm2's grouped path) + 2 us + floor / 0.7;
//   moe_vs_cublas  the fused ops faster cold than their cuBLAS grouped baseline
//                  (metrics.speedup_vs_cublas_grouped > 1).
// MoE layer cases (layer fused_moe; issue 46):
//   moe_layer_overhead  Mixtral-8x7B, T = 4096, 4 adapters of rank 16, tp 1, plain: LoRA overhead over
//                       the base MoE layer (metrics.lora_overhead_pct) <= 15%, counted only where the
//                       expert GEMMs run at >= 0.5 of the GEMM rate (metrics.base_gemm_rate_fraction).
#pragma once
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace punica::bench {

struct TargetRow {
  std::string name;    // dense_prefill, dense_decode, one_adapter_expand, linear_chain_cold, ...
  std::string group;   // op, or module/tp for the layer targets
  int cases = 0, met = 0;
  double median = -1;  // median of the measured value (dense_prefill: copy fraction), -1 when not meaningful
  double lo = -1, hi = -1;  // the smallest and largest measured value (with the median; -1 alike)
  std::vector<std::string> missed;  // "id: value vs bound"
};

struct TargetsReport {
  std::vector<TargetRow> rows;
  int cases = 0, met = 0;  // over every row
  std::string text;        // the table (and, with list_missed, every missed case)
  nlohmann::json doc;      // punica-bench.targets/1
};

// The targets' names, in the issues' order (the rows' order; `-t` takes these).
const std::vector<std::string>& target_names();

// Error(usage) when no document holds a case that any target applies to. by_tokens: the op targets'
// groups split by token count ("lora_shrink T=8192"), ordered by op and tokens, and the table gains a
// range column (the smallest and largest value of each group).
TargetsReport evaluate_targets(const std::vector<nlohmann::json>& docs, const std::vector<std::string>& names,
                               bool list_missed, bool by_tokens = false);

}  // namespace punica::bench
