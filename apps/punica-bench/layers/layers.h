// vLLM's tensor-parallel LoRA layers (SPEC §5) as Problems of op "layer", written once against
// Backend so they run on CUDA+NCCL and on CPU+MPI: Replicated, Column, MergedColumn (2 or >=3
// slices), QKV (one LoRA over q|k|v, GQA, kv-head replication), MergedQKV, Row, each column/row
// layer also fully sharded (S-LoRA), VocabParallelEmbedding and LogitsProcessor. Each rank builds
// only its own shard from the counter hash with GLOBAL indices; the reference recomputes the
// rank's expected output from the unsharded tensors.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>
#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/scenario.h"

namespace punica::bench {

// The "layer" op of the registry. The TP rank is Dist's rank modulo Case::tp (groups of tp
// consecutive ranks, as the backends' collectives use them); 0 without MPI.
std::unique_ptr<Problem> make_layer_problem(const Case& c, const BatchLayout& lay, const ProblemOptions& o);
// The same for an explicit rank inside the TP group (tests).
std::unique_ptr<Problem> make_layer_problem(const Case& c, const BatchLayout& lay, const ProblemOptions& o,
                                            int tp_rank);
// FusedMoEWithLoRA (SPEC §4.1, §4.7; moe_layer.cpp): layer "fused_moe" at TP rank (or EP rank) rho.
std::unique_ptr<Problem> make_moe_layer_problem(const Case& c, const BatchLayout& lay, const ProblemOptions& o,
                                                int rho);

namespace layers {

// Host helpers of the layer references: fn(begin, end) over [0, n) on several threads (one on small
// machines), and an fp64 dot product of fp32 vectors.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);
double dot(const float* a, const float* b, int64_t n);

// vLLM's expert placement under expert parallelism (determine_expert_map, linear): rank rho of ep
// owns the global experts [first, first + count), count = E/ep (+1 on the first E%ep ranks).
struct ExpertRange {
  int first = 0, count = 0;
};
ExpertRange expert_range(int num_experts, int ep, int rho);

// SPEC §5.4: per-rank q/kv shard of a QKV layer. nkv_rank = max(1, nkv/tp), rep = max(1, tp/nkv)
// (kv-head replicas), q_id = rho, kv_id = rho / rep.
struct QkvShard {
  int64_t q_total = 0, kv_total = 0;  // Q = nh*h, KV = nkv*h
  int64_t q_sh = 0, kv_sh = 0;        // per-rank widths nh/tp*h, nkv_rank*h
  int q_id = 0, kv_id = 0, rep = 1;
};
QkvShard qkv_shard(int num_heads, int num_kv_heads, int head_dim, int tp, int rho);

// SPEC §5.7: true rank of rank rho's slice of A along the rank dim (rows [rho*r/tp, (rho+1)*r/tp)
// of an adapter of true rank r_a, padded rank r): clamp(r_a - rho*r/tp, 0, r/tp).
int shard_true_rank(int true_rank, int max_rank, int tp, int rho);

// A column-family layer on one rank: its output columns grouped into the slices the LoRA op sees.
struct ColumnSlice {
  int lora = 0;                  // which sub-LoRA (lora_a.<i> / lora_b.<i>) feeds this slice
  std::vector<int64_t> b_rows;   // per local column: row of the full lora_b.<lora> [N_lora, r]
  std::vector<int64_t> w_rows;   // per local column: row of the full packed base weight [N, K]
  int64_t width() const { return int64_t(b_rows.size()); }
};
struct ColumnPlan {
  std::vector<int64_t> lora_rows;  // full (unsharded) output rows of each sub-LoRA's B
  int64_t packed_rows = 0;         // full N of the base weight (sum of the slices)
  std::vector<ColumnSlice> slices; // in output order; local width = sum of slice widths
  int64_t local_width() const {
    int64_t w = 0;
    for (auto& s : slices) w += s.width();
    return w;
  }
};
// layer: replicated | column | merged_column | qkv | merged_qkv. Replicated ignores tp (vLLM forces
// tp = 1 for it): every rank owns every row.
ColumnPlan column_plan(const Case& c, int tp, int rho);

// What rank rho of a column-family layer must output, from vLLM's rules written independently of
// column_plan (the scenario check's expectation): per local output column, the sub-LoRA it belongs
// to, its row in that sub-LoRA's full B, and its row in the full packed base weight.
struct ExpectedColumn {
  int lora = 0;
  int64_t b_row = 0, w_row = 0;
};
std::vector<ExpectedColumn> vllm_expected_columns(const Case& c, int tp, int rho);

}  // namespace layers
}  // namespace punica::bench
