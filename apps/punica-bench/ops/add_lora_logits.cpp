// Registry entry of add_lora_logits: vLLM's add_lora_logits (SPEC §3.5), the LoRA of the lm_head
// over the full vocabulary, per request.
#include "apps/punica-bench/ops/op_kit.h"

namespace punica::bench {
namespace {

using kernels::DType;

class LogitsProblem final : public Problem {
 public:
  LogitsProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    scale_ = c.scale;
    V_ = c.vocab;
    // One sampled row per request, routed by the request-level (prompt) mapping.
    k_.init(c, lay, b, lay.request_slot);
    k_.N = {V_};
    k_.S = 1;
    mapping_tensor = k_.meta.mapping;
    x_ = b.random("x", dtype, {k_.T, k_.K}, 1.0f);
    a_ = b.stacked("lora_a", dtype, k_.L, k_.r, k_.K, true, k_.slot_rank, 1.0f / std::sqrt(float(k_.K)), false);
    b_ = b.stacked("lora_b", dtype, k_.L, V_, k_.r, false, k_.slot_rank, 1.0f / std::sqrt(float(std::max(1, k_.r))), false);
    W_ = V_ + kGuardCols;
    y_ = b.output("y", dtype, {k_.T, W_}, true, k_.T, W_);
    mark_untouched(tensors[y_], k_.mapping, W_, 0, V_);
    ws_ = b.scratch("workspace", std::max<std::size_t>(16, kernels::add_lora_logits_workspace_bytes(
                                                                std::max<int64_t>(k_.T, 1), k_.r)));
  }
  kernels::AddLoraLogitsArgs args(const std::vector<void*>& p) const {
    kernels::AddLoraLogitsArgs a;
    a.dtype = dtype; a.num_rows = k_.T; a.hidden = k_.K; a.x = p[x_]; a.x_row_stride = k_.K;
    a.lora_a = p[a_]; a.lora_b = p[b_]; a.vocab_size = V_; a.max_loras = k_.L; a.max_rank = k_.r;
    a.lora_ranks = k_.ranks(p); a.meta = k_.meta.view(p); a.scale = scale_; a.y = p[y_];
    a.y_row_stride = W_; a.workspace = p[ws_];
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { k_.prepare_meta(be, p); }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    k_.host_meta(p);
    if (naive) ref::naive::add_lora_logits(args(p)); else ref::add_lora_logits(args(p));
  }
  std::string plan(const KernelChoice& k) const override {
    (void)k;
    return kernels::describe_add_lora_logits_plan(args(nulls()));  // shapes only: no pointer is read
  }
  Work work() const override {
    Work w;
    w.tokens = k_.T;
    double es = kernels::dtype_size(dtype);
    w.bytes = k_.sum_active_rank() * k_.K * es + k_.lora_tokens() * k_.K * es + k_.sum_active_rank() * V_ * es +
              2.0 * k_.lora_tokens() * V_ * es;
    w.flops = 2.0 * k_.lora_tokens_rank() * (double(k_.K) + V_);
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({k_.T, k_.r, k_.K, false});
    bl.dense.push_back({k_.T, V_, k_.r, true});  // the logits LoRA adds into the logits
    bl.grouped.push_back({k_.groups(1, k_.K, true), false});
    bl.grouped.push_back({k_.groups(V_, 0, false), true});
    return bl;
  }
  double rtol() const override { return default_rtol(dtype); }

 private:
  LoraCommon k_;
  float scale_;
  int64_t V_, W_;
  int x_, a_, b_, y_, ws_;
};

}  // namespace

void run_op(Backend& be, const kernels::AddLoraLogitsArgs& a) {
  be.exec([&](void* s) {
        kernels::launch_add_lora_logits(a, static_cast<cudaStream_t>(s));
      },
      [&] { ref::add_lora_logits(a); });
}

namespace {
OpSpec spec() {
  OpSpec s;
  s.name = "add_lora_logits";
  s.order = 50;
  s.summary = "logits (+)= scale * (x @ A^T) @ B^T over the vocabulary";
  s.in_default_scenario = true;
  s.defaults = [](CaseContext& x) { return x.c().vocab > 0 ? std::vector<int64_t>{x.c().vocab} : std::vector<int64_t>{}; };
  s.require = [](CaseContext& x) { require_vocab(x); require_hidden(x); };
  s.applicable = [](CaseContext& x) { skip_unless_module(x, {"lm_head"}); };
  s.make = [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return std::make_unique<LogitsProblem>(c, l, o); };
  return s;
}
const RegisterOp kRegistered{spec()};
}  // namespace

}  // namespace punica::bench
