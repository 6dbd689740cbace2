// Registry entry of lora_meta: vLLM's LoRAKernelMeta.prepare_tensors (SPEC §2.5): tokens sorted by
// adapter slot, the active slots, their token counts and start offsets, the no-LoRA flag.
#include "apps/punica-bench/ops/op_kit.h"

namespace punica::bench {
namespace {

using kernels::DType;

class LoraMetaProblem final : public Problem {
 public:
  LoraMetaProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) : L_(c.max_loras) {
    Builder b(c, o, tensors);
    T_ = c.num_tokens;
    m_ = add_meta(b, lay.token_slot, L_, /*as_outputs=*/true, meta_ws_bytes(T_, L_));
    dtype = DType::f32;
  }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, m_.args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    auto a = m_.args(p);
    if (naive) ref::naive::lora_meta(a); else ref::lora_meta(a);
  }
  std::string plan(const KernelChoice& k) const override {
    (void)k;
    return kernels::describe_lora_meta_plan(m_.args(nulls()));  // shapes only: no pointer is read
  }
  Work work() const override {
    Work w;
    w.tokens = T_;
    w.bytes = double(T_) * 4 * 3 + double(L_ + 1) * 12;  // read mapping; write copy + sorted; small arrays
    return w;
  }

 private:
  int L_;
  int64_t T_;
  MetaIdx m_;
};

}  // namespace

void run_op(Backend& be, const kernels::LoraMetaArgs& a) {
  be.exec([&](void* s) {
        kernels::launch_lora_meta(a, static_cast<cudaStream_t>(s));
      },
      [&] { ref::lora_meta(a); });
}

namespace {
OpSpec spec() {
  OpSpec s;
  s.name = "lora_meta";
  s.order = 0;
  s.summary = "LoRAKernelMeta: tokens sorted by adapter, active adapters, counts, offsets";
  s.in_default_scenario = true;
  s.make = [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return std::make_unique<LoraMetaProblem>(c, l, o); };
  return s;
}
const RegisterOp kRegistered{spec()};
}  // namespace

}  // namespace punica::bench
