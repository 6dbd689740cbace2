// Registry entry of add_lora_fused_moe: vLLM's PunicaWrapper.add_lora_fused_moe / fused_moe_lora
// (SPEC §4.3-4.4), one call (shrink and expand fused) over the routing of an untimed alignment
// (prepare(); the alignment is timed as its own op and inside add_lora_w13): w13 form (x row =
// token, gate|up or one slice) or w2 form (x row = pair, times the routing weight), naive or
// block-aligned path.
#include "apps/punica-bench/ops/moe_kit.h"

namespace punica::bench {
namespace {

class FusedMoeProblem final : public MoeFusedProblem {
 public:
  FusedMoeProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    m_.build(c, lay, o, tensors, moe_config(c).form == "w2", c.offset_start);
    dtype = m_.dtype;
    mapping_tensor = m_.k.map_idx;
    naive_ = m_.k.path_naive();
    naive_align_ = true;  // naive: each pair's local expert (vLLM's topk_ids where there is no expert_map)
  }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  std::string describe() const override { return "form=" + m_.describe(naive_); }
  std::string plan(const KernelChoice&) const override {
    return std::string("add_lora_fused_moe ") + (naive_ ? "naive" : "aligned bs=" + std::to_string(m_.k.cfg.block_size)) +
           (m_.f.w2 ? " w2" : " w13") + " S=" + std::to_string(m_.f.S);
  }
};

}  // namespace

void run_op(Backend& be, const kernels::FusedMoeLoraArgs& a) {
  be.exec([&](void* s) { kernels::launch_add_lora_fused_moe(a, static_cast<cudaStream_t>(s)); },
          [&] { ref::add_lora_fused_moe(a); });
}
void run_fused_moe_lora_shrink(Backend& be, const kernels::FusedMoeLoraArgs& a) {
  be.exec([&](void* s) { kernels::launch_fused_moe_lora_shrink(a, static_cast<cudaStream_t>(s)); },
          [&] { ref::fused_moe_lora_shrink(a); });
}
void run_fused_moe_lora_expand(Backend& be, const kernels::FusedMoeLoraArgs& a) {
  be.exec([&](void* s) { kernels::launch_fused_moe_lora_expand(a, static_cast<cudaStream_t>(s)); },
          [&] { ref::fused_moe_lora_expand(a); });
}

namespace {
OpSpec spec() {
  OpSpec s = moe_spec<FusedMoeProblem>(
      "add_lora_fused_moe", 110,
      "MoE pairs' y[M, k, offset + S*N] (+)= (w *) B[l,e] . (A[l,e] . x) (fused_moe_lora, w13 | w2 form)",
      {"form", "moe_intermediate", "num_experts", "top_k", "expert_map", "gated", "disabled_adapters", "shared_lora",
       "routing", "oob_expert_fraction", "block_size", "naive"},
      2);
  s.applicable = [](CaseContext& x) {
    moe_applicable(x);
    if (x.has("gated") && x.has("form") && x.value("form") == "w2" && !x.value("gated").get<bool>())
      x.skip("gated applies to the w13 form only");
  };
  return s;
}
const RegisterOp kRegistered{spec()};
}  // namespace

}  // namespace punica::bench
