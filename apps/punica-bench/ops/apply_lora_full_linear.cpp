// Registry entry of apply_lora_full_linear: vLLM's modules_to_save classifier heads (SPEC §3.6), each
// request's rows replaced by its adapter's full linear layer where the module is enabled.
#include "apps/punica-bench/ops/op_kit.h"
#include "kernels/apply_lora_full_linear/apply_lora_full_linear.h"

namespace punica::bench {

void run_op(Backend& be, const kernels::ApplyLoraFullLinearArgs& a);  // below (no layer calls it)

namespace {

using kernels::DType;

class FullLinearProblem final : public Problem {
 public:
  FullLinearProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    L_ = c.max_loras;
    in_ = c.hidden;
    out_ = c.out_features;
    map_ = lay.request_slot;
    R_ = int64_t(map_.size());
    m_ = add_meta(b, map_, L_, false, meta_ws_bytes(R_, L_));
    mapping_tensor = m_.mapping;
    x_ = b.random("x", dtype, {R_, in_}, 1.0f);
    w_ = b.random("weight", dtype, {L_, out_, in_}, 1.0f / std::sqrt(float(in_)));
    bias_ = b.random("bias", dtype, {L_, out_}, 0.5f);
    // Every third adapter slot has its full module disabled (module_enabled = 0).
    enabled_.assign(std::size_t(L_), 0);
    for (std::size_t a = 0; a < lay.adapter_slot.size(); ++a) enabled_[std::size_t(lay.adapter_slot[a])] = (a % 3 != 2);
    en_ = b.ints("module_enabled", enabled_);
    W_ = out_ + kGuardCols;
    y_ = b.output("y", dtype, {R_, W_}, true, R_, W_);
    auto& y = tensors[y_];
    for (int64_t j = 0; j < R_; ++j)
      for (int64_t c2 = 0; c2 < W_; ++c2) {
        int32_t s = map_[std::size_t(j)];
        bool replaced = s >= 0 && enabled_[std::size_t(s)] && c2 < out_;
        y.must_keep[std::size_t(j * W_ + c2)] = !replaced;
      }
  }
  kernels::ApplyLoraFullLinearArgs args(const std::vector<void*>& p) const {
    kernels::ApplyLoraFullLinearArgs a;
    a.dtype = dtype; a.num_rows = R_; a.in_features = in_; a.out_features = out_; a.x = p[x_];
    a.x_row_stride = in_; a.weight = p[w_]; a.bias = p[bias_];
    a.module_enabled = static_cast<const int32_t*>(p[en_]); a.max_loras = L_; a.meta = m_.view(p);
    a.y = p[y_]; a.y_row_stride = W_;
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { run_op(be, m_.args(p)); }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    ref::lora_meta(m_.args(p));
    if (naive) ref::naive::apply_lora_full_linear(args(p)); else ref::apply_lora_full_linear(args(p));
  }
  std::string plan(const KernelChoice& k) const override {
    (void)k;
    return kernels::describe_apply_lora_full_linear_plan(args(nulls()));  // shapes only: no pointer is read
  }
  Work work() const override {
    Work w;
    w.tokens = R_;
    double es = kernels::dtype_size(dtype);
    auto act = active_set(map_, L_);
    double used = 0, rows = 0;
    for (int l : act.active_slots) if (enabled_[std::size_t(l)]) { used += 1; rows += double(act.tokens_of_slot[std::size_t(l)]); }
    w.bytes = used * double(out_) * (in_ + 1) * es + rows * in_ * es + 2.0 * rows * out_ * es;
    w.flops = 2.0 * rows * in_ * out_;
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({R_, out_, in_});
    auto act = active_set(map_, L_);
    Baseline::Grouped g;  // the op replaces its rows: no accumulate
    for (int l : act.active_slots) g.groups.push_back({act.tokens_of_slot[std::size_t(l)], out_, in_});
    bl.grouped.push_back(g);
    return bl;
  }
  double rtol() const override { return default_rtol(dtype); }

 private:
  int L_;
  int64_t in_, out_, R_, W_;
  std::vector<int32_t> map_, enabled_;
  MetaIdx m_;
  int x_, w_, bias_, en_, y_;
};

}  // namespace

void run_op(Backend& be, const kernels::ApplyLoraFullLinearArgs& a) {
  be.exec([&](void* s) {
        kernels::launch_apply_lora_full_linear(a, static_cast<cudaStream_t>(s));
      },
      [&] { ref::apply_lora_full_linear(a); });
}

namespace {
OpSpec spec() {
  OpSpec s;
  s.name = "apply_lora_full_linear";
  s.order = 60;
  s.summary = "y = x @ W[slot]^T + bias[slot] where the adapter's module is enabled";
  s.in_default_scenario = true;
  FieldSpec out;
  out.name = "out_features";
  out.order = 120;  // after vocab, in the canonical order
  out.value_schema = nlohmann::json::parse(R"({"type": "integer", "minimum": 1})");
  out.description = "The classifier head's width (num_labels); default 8.";
  s.fields = {out};
  s.defaults = [](CaseContext& x) {
    if (!x.has("out_features")) x.c().out_features = 8;
    return std::vector<int64_t>{x.c().out_features};
  };
  s.require = [](CaseContext& x) { require_hidden(x); };
  s.applicable = [](CaseContext& x) { skip_unless_module(x, {}); };
  s.make = [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return std::make_unique<FullLinearProblem>(c, l, o); };
  return s;
}
const RegisterOp kRegistered{spec()};
}  // namespace

}  // namespace punica::bench
