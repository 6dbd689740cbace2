// Registry entry of bgmv_moe_gemm1_lora_delta: FlashInfer's FC1 (gate_up) MoE LoRA delta (SPEC
// §4.8.4), out[t, j] = scale * [B_gate . round(A_gate . x[t]) | B_up . round(A_up . x[t])] (regular)
// or scale * B_fused . round(A . x[t]) (shared_a), for every (token, routed slot), unweighted; rows of
// tokens without an adapter exactly 0. The weights are reached through int64 pointer tables in
// FlashInfer's fill_w_ptr layout, rebuilt in prepare() for every rotated copy of the inputs.
#include "apps/punica-bench/ops/moe_delta_kit.h"

namespace punica::bench {
namespace {

class Gemm1Problem final : public DeltaProblem {
 public:
  Gemm1Problem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder bld(c, o, tensors);
    dtype = c.dtype;
    out_dtype_ = delta_out_dtype(c);
    scale_ = c.scale;
    k_.init(c, lay, bld);
    mapping_tensor = k_.map_idx;
    shared_a_ = c.params.contains("shared_a") && c.params["shared_a"].get<bool>();
    const MoeConfig& m = k_.cfg;
    S_ = shared_a_ ? 1 : 2;
    N_ = shared_a_ ? 2 * m.I : m.I;
    W_ = 2 * m.I;
    x_ = bld.random("x", dtype, {std::max<int64_t>(k_.M, 1), m.H}, 1.0f);
    const int Eg = m.shared ? 1 : m.E;  // shared_lora: a stride-0 expert dim in both tables
    const float as = 1.0f / std::sqrt(float(m.H)), bs = 1.0f / std::sqrt(float(std::max(1, k_.r)));
    const char* names[2] = {"gate", "up"};
    std::vector<int> a, b;
    for (int s = 0; s < S_; ++s) {
      const std::string tag = shared_a_ ? "" : std::string(".") + names[s];
      a.push_back(moe_stacked(bld, o, "lora_a" + tag, dtype, k_, Eg, k_.r, m.H, true, as));
      b.push_back(moe_stacked(bld, o, "lora_b" + tag, dtype, k_, Eg, N_, k_.r, false, bs));
    }
    tables_.add(bld, m.E, a, b);
    ld_ = W_ + kGuardCols;
    out_ = bld.output("out", out_dtype_, {k_.M, m.top_k, ld_}, false, k_.M, int64_t(m.top_k) * ld_);
    HostTensor& y = tensors[std::size_t(out_)];
    for (std::size_t i = 0; i < y.numel(); ++i)
      if (int64_t(i % std::size_t(ld_)) >= W_) y.must_keep[i] = 1;
    ws_bytes_ = std::max<std::size_t>(16, kernels::bgmv_moe_gemm1_workspace_bytes(args(nulls())));
    ws_ = bld.scratch("workspace", ws_bytes_);
  }
  kernels::BgmvMoeGemm1Args args(const std::vector<void*>& p) const {
    kernels::BgmvMoeGemm1Args a;
    fill(a, p);
    a.shared_a = shared_a_;
    a.x = x_ < 0 ? nullptr : p[std::size_t(x_)];
    return a;
  }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  static void run_on(Backend& be, const kernels::BgmvMoeGemm1Args& a) {
    exec(be, a, kernels::launch_bgmv_moe_gemm1_lora_delta, [](const kernels::BgmvMoeGemm1Args& x) { ref::bgmv_moe_gemm1_lora_delta(x); });
  }
  void reference(const std::vector<void*>& p, bool naive) override {
    tables_.write_host(tensors, p);
    if (naive) ref::naive::bgmv_moe_gemm1_lora_delta(args(p)); else ref::bgmv_moe_gemm1_lora_delta(args(p));
  }
  std::string describe() const override {
    return std::string(shared_a_ ? "shared_a" : "regular") + " H=" + std::to_string(k_.cfg.H) + " I=" +
           std::to_string(k_.cfg.I) + " E=" + std::to_string(k_.cfg.E) + " top_k=" + std::to_string(k_.cfg.top_k) +
           " out=" + kernels::dtype_name(out_dtype_) + " pairs(adapter,expert)=" + std::to_string(k_.touched().size());
  }
  std::string plan(const KernelChoice&) const override { return kernels::describe_bgmv_moe_gemm1_plan(args(nulls())); }
  DeltaShape shape() const {
    DeltaShape d;
    d.a_cols = k_.cfg.H;
    d.a_rows_per_r = S_;
    d.b_rows = W_;
    d.out_bytes = double(k_.numel()) * double(W_) * double(kernels::dtype_size(out_dtype_));
    return d;
  }
  Work work() const override {
    double xrows = 0;
    for (int64_t m = 0; m < k_.M; ++m)
      for (int j = 0; j < k_.cfg.top_k; ++j)
        if (k_.pair_slot(m * k_.cfg.top_k + j) >= 0) { xrows += 1; break; }
    return delta_work(k_, k_.touched(), xrows, shape(), dtype, k_.cfg.shared);
  }
  Baseline baseline() const override { return delta_baseline(k_, k_.touched(), shape()); }

 private:
  bool shared_a_ = false;
  int S_ = 2;
  int64_t N_ = 0, W_ = 0;
  int x_ = -1;
};

}  // namespace

void run_op(Backend& be, const kernels::BgmvMoeGemm1Args& a) { Gemm1Problem::run_on(be, a); }

namespace {
const RegisterOp kRegistered{moe_delta_spec<Gemm1Problem>(
      "bgmv_moe_gemm1_lora_delta", 140,
      "FlashInfer's FC1 MoE LoRA delta [T, k, 2I] = scale * B . round(A . x[token]) per routed slot (regular | "
      "shared_a), pointer tables",
      {"shared_a", "out_dtype"})};
}  // namespace

}  // namespace punica::bench
