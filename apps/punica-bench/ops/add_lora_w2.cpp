// Registry entry of add_lora_w2: vLLM's PunicaWrapper.add_lora_w2 (SPEC §4.6), the fused op in the
// w2 form over the routing add_lora_w13 returned (its alignment, or the naive path, by vLLM's
// sparsity rule: built untimed in prepare(), as it is timed inside add_lora_w13),
// y[m, j, offset : offset + H] += w[m,j] . B[l,e] . (A[l,e] . x[m*k + j]).
#include "apps/punica-bench/ops/moe_kit.h"

namespace punica::bench {
namespace {

class W2Problem final : public MoeFusedProblem {
 public:
  W2Problem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    m_.build(c, lay, o, tensors, true, c.offset_start);
    dtype = m_.dtype;
    mapping_tensor = m_.k.map_idx;
    naive_ = m_.k.rule_naive();  // the path add_lora_w13 took
    naive_align_ = false;        // its naive path hands topk_ids as they are
  }
  void run(Backend& be, const std::vector<void*>& p) override { run_add_lora_w2(be, args(p)); }
  std::string describe() const override { return m_.describe(naive_) + " (add_lora_w13's, vLLM's sparsity rule)"; }
  std::string plan(const KernelChoice&) const override {
    return std::string("add_lora_w2 ") + (naive_ ? "naive" : "aligned bs=" + std::to_string(m_.k.cfg.block_size)) +
           " " + kernels::moe_heur::plan(args(nulls()), /*split=*/true).name();
  }
};

}  // namespace

void run_add_lora_w2(Backend& be, const kernels::FusedMoeLoraArgs& a) {
  be.exec([&](void* s) { kernels::launch_add_lora_w2(a, static_cast<cudaStream_t>(s)); },
          [&] { ref::add_lora_w2(a); });
}

namespace {
const RegisterOp kRegistered{moe_spec<W2Problem>(
    "add_lora_w2", 130,
    "add_lora_w2: fused op, w2 form over add_lora_w13's routing, y[M, k, offset + H] += w . B . (A . x[pair])",
    {"moe_intermediate", "num_experts", "top_k", "expert_map", "disabled_adapters", "shared_lora", "routing",
     "oob_expert_fraction", "block_size"},
    1)};
}  // namespace

}  // namespace punica::bench
