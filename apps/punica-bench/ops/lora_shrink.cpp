// Registry entry of lora_shrink: vLLM's add_shrink / lora_shrink (SPEC §3.1), y[s, t, :] =
// scale * x[t] @ A[slot(t)][s]^T over S slices, into an fp32 (or 16-bit) intermediate.
#include "apps/punica-bench/ops/op_kit.h"

namespace punica::bench {
namespace {

using kernels::DType;

class ShrinkProblem final : public Problem {
 public:
  ShrinkProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    out_dtype_ = c.intermediate_dtype;
    scale_ = c.scale;
    x_ = b.random("x", dtype, {int64_t(lay.token_slot.size()), c.hidden}, 1.0f);
    k_.init(c, lay, b, lay.token_slot);
    mapping_tensor = k_.meta.mapping;
    float as = 1.0f / std::sqrt(float(c.hidden));
    for (int s = 0; s < k_.S; ++s) {
      bool none = std::find(c.none_slices.begin(), c.none_slices.end(), s) != c.none_slices.end();
      a_[s] = b.stacked("lora_a." + std::to_string(s), dtype, k_.L, k_.r, k_.K, true, k_.slot_rank, as, none);
    }
    y_ = b.output("y", out_dtype_, {k_.S, k_.T, k_.r}, false, k_.T, k_.r);
  }
  kernels::LoraShrinkArgs args(const std::vector<void*>& p) const {
    kernels::LoraShrinkArgs a;
    a.dtype = dtype; a.out_dtype = out_dtype_; a.num_tokens = k_.T; a.hidden = k_.K;
    a.x = p[x_]; a.x_row_stride = k_.K; a.num_slices = k_.S;
    for (int s = 0; s < k_.S; ++s) a.lora_a[s] = p[a_[s]];
    a.max_loras = k_.L; a.max_rank = k_.r; a.lora_ranks = k_.ranks(p); a.num_active_loras = k_.active_hint;
    a.meta = k_.meta.view(p); a.scale = scale_; a.y = p[y_];
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { k_.prepare_meta(be, p); }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    k_.host_meta(p);
    if (naive) ref::naive::lora_shrink(args(p)); else ref::lora_shrink(args(p));
  }
  std::string plan(const KernelChoice& k) const override {
    (void)k;
    return kernels::describe_lora_shrink_plan(args(nulls()), k.shrink);  // shapes only: no pointer is read
  }
  Work work() const override {
    Work w;
    w.tokens = k_.T;
    w.bytes = k_.S * k_.sum_active_rank() * k_.K * 2 + k_.lora_tokens() * k_.K * kernels::dtype_size(dtype) +
              double(k_.S) * k_.lora_tokens() * k_.r * kernels::dtype_size(out_dtype_);
    w.flops = 2.0 * k_.S * k_.lora_tokens_rank() * k_.K;
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({k_.T, int64_t(k_.S) * k_.r, k_.K, false});  // the shrink writes y
    bl.grouped.push_back({k_.groups(k_.S, k_.K, true), false});
    return bl;
  }
  double rtol() const override { return default_rtol(out_dtype_ == DType::f32 ? dtype : out_dtype_); }

 private:
  LoraCommon k_;
  DType out_dtype_;
  float scale_;
  int x_, y_, a_[kernels::kMaxSlices];
};

}  // namespace

void run_op(Backend& be, const kernels::LoraShrinkArgs& a) {
  be.exec([&](void* s) {
        const auto kind = be.kernel_choice().shrink;
        if (kind != kernels::ShrinkKernel::automatic)
          kernels::launch_lora_shrink_with(a, kind, static_cast<cudaStream_t>(s));
        else
          kernels::launch_lora_shrink(a, static_cast<cudaStream_t>(s));
      },
      [&] { ref::lora_shrink(a); });
}

namespace {
OpSpec spec() {
  OpSpec s;
  s.name = "lora_shrink";
  s.order = 10;
  s.summary = "y[S,T,r] = scale * x @ A[slot]^T (add_shrink)";
  s.in_default_scenario = true;
  s.exclusive_fields = {"active_loras_hint"};
  s.require = [](CaseContext& x) { require_hidden(x); require_slices(x); };
  s.applicable = [](CaseContext& x) { skip_unless_module(x, {"qkv", "o", "gate_up", "down", "lm_head"}); };
  s.kernel_kinds = [] { return shrink_kernel_names(); };
  s.make = [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return std::make_unique<ShrinkProblem>(c, l, o); };
  return s;
}
const RegisterOp kRegistered{spec()};
}  // namespace

}  // namespace punica::bench
