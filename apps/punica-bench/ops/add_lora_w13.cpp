// Registry entry of add_lora_w13: vLLM's PunicaWrapper.add_lora_w13 (SPEC §4.5), the alignment (or
// none: the naive path of vLLM's sparsity rule, recorded in the plan) then the fused op in the w13
// form, y[m, j, 0 : S*I] += B_s[l,e] . (A_s[l,e] . x[m]), timed together as vLLM runs them at every
// MoE layer call.
#include "apps/punica-bench/ops/moe_kit.h"

namespace punica::bench {
namespace {

class W13Problem final : public Problem {
 public:
  W13Problem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    m_.build(c, lay, o, tensors, false, 0);
    dtype = m_.dtype;
    mapping_tensor = m_.k.map_idx;
  }
  kernels::AddLoraW13Args args(const std::vector<void*>& p) const {
    const MoeCommon& k = m_.k;
    kernels::AddLoraW13Args w;
    w.op = m_.args(p);  // op.routing: filled by the launcher
    w.topk_ids = k.ptr(p, k.topk_idx);
    w.expert_map = k.ptr(p, k.emap_idx);
    w.num_experts_global = k.cfg.has_map() ? k.cfg.E : 0;
    w.block_size = k.cfg.block_size;
    w.lora_ids = k.ptr(p, k.lora_ids_idx);
    w.sorted_token_ids = k.mptr(p, k.sorted_idx);
    w.expert_ids = k.mptr(p, k.eids_idx);
    w.num_tokens_post_pad = k.mptr(p, k.ntpp_idx);
    w.workspace = p[std::size_t(k.ws_idx)];
    w.workspace_bytes = k.ws_bytes;
    return w;
  }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    if (naive) ref::naive::add_lora_w13(args(p)); else ref::add_lora_w13(args(p));
  }
  bool naive_path() const { return kernels::moe_lora_w13_routing(args(nulls())).naive; }
  std::string describe() const override { return m_.describe(naive_path()) + " (vLLM's sparsity rule)"; }
  std::string plan(const KernelChoice&) const override {
    kernels::FusedMoeLoraArgs op = args(nulls()).op;
    op.routing = kernels::moe_lora_w13_routing(args(nulls()));
    return (naive_path() ? std::string("add_lora_w13 naive (no alignment)")
                         : "add_lora_w13 align+fused bs=" + std::to_string(m_.k.cfg.block_size)) +
           " " + kernels::moe_heur::plan(op, /*split=*/true).name();
  }
  Work work() const override { return m_.work(); }
  Baseline baseline() const override { return m_.baseline(); }

 private:
  MoeFused m_;
};

}  // namespace

kernels::MoeLoraRouting run_op(Backend& be, const kernels::AddLoraW13Args& a) {
  be.exec([&](void* s) { kernels::launch_add_lora_w13(a, static_cast<cudaStream_t>(s)); },
          [&] { ref::add_lora_w13(a); });
  return kernels::moe_lora_w13_routing(a);
}

namespace {
const RegisterOp kRegistered{moe_spec<W13Problem>(
    "add_lora_w13", 120, "add_lora_w13: alignment (vLLM's sparsity rule) + fused op, y[M, k, S*I] += B . (A . x[token])",
    {"moe_intermediate", "num_experts", "top_k", "expert_map", "gated", "disabled_adapters", "shared_lora", "routing",
     "oob_expert_fraction", "block_size"},
    0)};
}  // namespace

}  // namespace punica::bench
