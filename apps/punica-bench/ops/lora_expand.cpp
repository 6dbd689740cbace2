// Registry entry of lora_expand: vLLM's add_expand / lora_expand (SPEC §3.2), y[t, offset + slice
// columns] (+)= x[s, t] @ B[slot(t)][s]^T.
#include "apps/punica-bench/ops/op_kit.h"

namespace punica::bench {
namespace {

using kernels::DType;

class ExpandProblem final : public Problem {
 public:
  ExpandProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    in_dtype_ = c.intermediate_dtype;
    add_inputs_ = c.add_inputs;
    offset_ = c.offset_start;
    k_.init(c, lay, b, lay.token_slot);
    mapping_tensor = k_.meta.mapping;
    x_ = b.random("x", in_dtype_, {k_.S, k_.T, k_.r}, 1.0f);
    float bs = 1.0f / std::sqrt(float(std::max(1, k_.r)));
    for (int s = 0; s < k_.S; ++s) {
      bool none = std::find(c.none_slices.begin(), c.none_slices.end(), s) != c.none_slices.end();
      b_[s] = b.stacked("lora_b." + std::to_string(s), dtype, k_.L, k_.N[s], k_.r, false, k_.slot_rank, bs, none);
    }
    // kGuardCols extra columns after the slices prove nothing outside them is written.
    W_ = offset_ + int64_t(k_.sumN()) + kGuardCols;
    y_ = b.output("y", dtype, {k_.T, W_}, add_inputs_, k_.T, W_);
    mark_untouched(tensors[y_], k_.mapping, W_, offset_, offset_ + int64_t(k_.sumN()));
  }
  kernels::LoraExpandArgs args(const std::vector<void*>& p) const {
    kernels::LoraExpandArgs a;
    a.in_dtype = in_dtype_; a.dtype = dtype; a.num_tokens = k_.T; a.x = p[x_]; a.num_slices = k_.S;
    for (int s = 0; s < k_.S; ++s) { a.lora_b[s] = p[b_[s]]; a.slice_width[s] = k_.N[s]; }
    a.max_loras = k_.L; a.max_rank = k_.r; a.lora_ranks = k_.ranks(p); a.meta = k_.meta.view(p);
    a.num_active_loras = k_.active_hint;
    a.y = p[y_]; a.y_row_stride = W_; a.offset_start = offset_; a.add_inputs = add_inputs_;
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { k_.prepare_meta(be, p); }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    k_.host_meta(p);
    if (naive) ref::naive::lora_expand(args(p)); else ref::lora_expand(args(p));
  }
  std::string plan(const KernelChoice& k) const override {
    (void)k;
    return kernels::describe_lora_expand_plan(args(nulls()), k.expand);  // shapes only: no pointer is read
  }
  Work work() const override {
    Work w;
    w.tokens = k_.T;
    double yb = k_.lora_tokens() * k_.sumN() * kernels::dtype_size(dtype);
    w.bytes = k_.sum_active_rank() * k_.sumN() * kernels::dtype_size(dtype) +
              double(k_.S) * k_.lora_tokens() * k_.r * kernels::dtype_size(in_dtype_) + (add_inputs_ ? 2 : 1) * yb;
    w.flops = 2.0 * k_.lora_tokens_rank() * k_.sumN();
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({k_.T, int64_t(k_.sumN()), k_.r, add_inputs_});
    bl.grouped.push_back({k_.groups(int64_t(k_.sumN()), 0, false), add_inputs_});
    return bl;
  }
  double rtol() const override { return default_rtol(dtype); }

 private:
  LoraCommon k_;
  DType in_dtype_;
  bool add_inputs_;
  int64_t offset_, W_;
  int x_, y_, b_[kernels::kMaxSlices];
};

}  // namespace

void run_op(Backend& be, const kernels::LoraExpandArgs& a) {
  be.exec([&](void* s) {
        const auto kind = be.kernel_choice().expand;
        if (kind != kernels::ExpandPrefillKernel::automatic)
          kernels::launch_lora_expand_with(a, kind, static_cast<cudaStream_t>(s));
        else
          kernels::launch_lora_expand(a, static_cast<cudaStream_t>(s));
      },
      [&] { ref::lora_expand(a); });
}

namespace {
OpSpec spec() {
  OpSpec s;
  s.name = "lora_expand";
  s.order = 20;
  s.summary = "y[T, offset + N] (+)= x[S,T,r] @ B[slot]^T (add_expand)";
  s.in_default_scenario = true;
  s.exclusive_fields = {"active_loras_hint"};
  s.require = [](CaseContext& x) { require_slices(x); };
  s.applicable = [](CaseContext& x) { skip_unless_module(x, {"qkv", "o", "gate_up", "down", "lm_head"}); };
  s.kernel_kinds = [] { return expand_kernel_names(); };
  s.make = [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return std::make_unique<ExpandProblem>(c, l, o); };
  return s;
}
const RegisterOp kRegistered{spec()};
}  // namespace

}  // namespace punica::bench
