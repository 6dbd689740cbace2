// Registry entry of add_lora_linear: vLLM's PunicaWrapper.add_lora_linear (SPEC §3.3), shrink into
// a workspace and expand into y, one call.
#include "apps/punica-bench/ops/op_kit.h"

namespace punica::bench {
namespace {

using kernels::DType;

class LinearProblem final : public Problem {
 public:
  LinearProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    scale_ = c.scale;
    add_inputs_ = c.add_inputs;
    x_ = b.random("x", dtype, {int64_t(lay.token_slot.size()), c.hidden}, 1.0f);
    k_.init(c, lay, b, lay.token_slot);
    mapping_tensor = k_.meta.mapping;
    float as = 1.0f / std::sqrt(float(c.hidden)), bs = 1.0f / std::sqrt(float(std::max(1, k_.r)));
    for (int s = 0; s < k_.S; ++s) {
      bool none = std::find(c.none_slices.begin(), c.none_slices.end(), s) != c.none_slices.end();
      a_[s] = b.stacked("lora_a." + std::to_string(s), dtype, k_.L, k_.r, k_.K, true, k_.slot_rank, as, none);
      b_[s] = b.stacked("lora_b." + std::to_string(s), dtype, k_.L, k_.N[s], k_.r, false, k_.slot_rank, bs, none);
    }
    W_ = int64_t(k_.sumN()) + kGuardCols;
    y_ = b.output("y", dtype, {k_.T, W_}, add_inputs_, k_.T, W_);
    mark_untouched(tensors[y_], k_.mapping, W_, 0, int64_t(k_.sumN()));
    ws_ = b.scratch("workspace", std::max<std::size_t>(16, kernels::add_lora_linear_workspace_bytes(
                                                                std::max<int64_t>(k_.T, 1), k_.S, k_.r)));
  }
  kernels::AddLoraLinearArgs args(const std::vector<void*>& p) const {
    kernels::AddLoraLinearArgs a;
    a.dtype = dtype; a.num_tokens = k_.T; a.hidden = k_.K; a.x = p[x_]; a.x_row_stride = k_.K;
    a.num_slices = k_.S;
    for (int s = 0; s < k_.S; ++s) { a.lora_a[s] = p[a_[s]]; a.lora_b[s] = p[b_[s]]; a.slice_width[s] = k_.N[s]; }
    a.max_loras = k_.L; a.max_rank = k_.r; a.lora_ranks = k_.ranks(p); a.meta = k_.meta.view(p);
    a.num_active_loras = k_.active_hint;
    a.scale = scale_; a.y = p[y_]; a.y_row_stride = W_; a.add_inputs = add_inputs_; a.workspace = p[ws_];
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { k_.prepare_meta(be, p); }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    k_.host_meta(p);
    if (naive) ref::naive::add_lora_linear(args(p)); else ref::add_lora_linear(args(p));
  }
  std::string plan(const KernelChoice& k) const override {
    (void)k;
    return kernels::describe_add_lora_linear_plan(args(nulls()));  // shapes only: no pointer is read
  }
  Work work() const override {
    Work w;
    w.tokens = k_.T;
    double es = kernels::dtype_size(dtype);
    w.bytes = k_.S * k_.sum_active_rank() * k_.K * es + k_.lora_tokens() * k_.K * es +
              k_.sum_active_rank() * k_.sumN() * es + (add_inputs_ ? 2 : 1) * k_.lora_tokens() * k_.sumN() * es;
    w.flops = 2.0 * k_.lora_tokens_rank() * (k_.S * double(k_.K) + k_.sumN());
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({k_.T, int64_t(k_.S) * k_.r, k_.K, false});
    bl.dense.push_back({k_.T, int64_t(k_.sumN()), k_.r, add_inputs_});
    bl.grouped.push_back({k_.groups(k_.S, k_.K, true), false});
    bl.grouped.push_back({k_.groups(int64_t(k_.sumN()), 0, false), add_inputs_});
    return bl;
  }
  double rtol() const override { return default_rtol(dtype); }

 private:
  LoraCommon k_;
  float scale_;
  bool add_inputs_;
  int64_t W_;
  int x_, y_, ws_, a_[kernels::kMaxSlices], b_[kernels::kMaxSlices];
};

}  // namespace

void run_op(Backend& be, const kernels::AddLoraLinearArgs& a) {
  be.exec([&](void* s) {
        kernels::launch_add_lora_linear(a, static_cast<cudaStream_t>(s));
      },
      [&] { ref::add_lora_linear(a); });
}

namespace {
OpSpec spec() {
  OpSpec s;
  s.name = "add_lora_linear";
  s.order = 30;
  s.summary = "y (+)= scale * (x @ A^T) @ B^T per slice (shrink + expand)";
  s.in_default_scenario = true;
  s.exclusive_fields = {"active_loras_hint"};
  s.require = [](CaseContext& x) { require_hidden(x); require_slices(x); };
  s.applicable = [](CaseContext& x) { skip_unless_module(x, {"qkv", "o", "gate_up", "down", "lm_head"}); };
  s.make = [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return std::make_unique<LinearProblem>(c, l, o); };
  return s;
}
const RegisterOp kRegistered{spec()};
}  // namespace

}  // namespace punica::bench
