// Registry entry of bgmv_moe_gemm2_lora_delta: FlashInfer's FC2 (down) MoE LoRA delta (SPEC §4.8.5),
// out[t] = scale * sum_j w[t, j] * B[l,e] . round(A[l,e] . act[perm[t*k + j]]) over the token's slots
// with perm >= 0 ([T, H], added to the MoE output). act is the permuted post-activation [rows, I]
// (a seeded permutation of the pairs, `inactive_slot_fraction` of them -1); [E] pointer tables in
// FlashInfer's fill_w_ptr layout, rebuilt in prepare() for every rotated copy of the inputs.
#include "apps/punica-bench/ops/moe_delta_kit.h"

namespace punica::bench {
namespace {

class Gemm2Problem final : public DeltaProblem {
 public:
  Gemm2Problem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder bld(c, o, tensors);
    dtype = c.dtype;
    out_dtype_ = delta_out_dtype(c);
    scale_ = c.scale;
    k_.init(c, lay, bld);
    mapping_tensor = k_.map_idx;
    const MoeConfig& m = k_.cfg;
    if (o.exact) {  // --exact: dyadic routing weights, so the fp32 sums over slots are exact in any order
      HostTensor& wt = tensors[std::size_t(k_.w_idx)];
      const uint64_t wkey = bld.key("exact_weights");
      for (std::size_t i = 0; i < k_.weights.size(); ++i) {
        k_.weights[i] = 0.25f * float(1 + hash_below(wkey, uint64_t(i), 4));
        std::memcpy(wt.data.data() + 4 * i, &k_.weights[i], 4);
      }
    }
    const double inactive =
        c.params.contains("inactive_slot_fraction") ? c.params["inactive_slot_fraction"].get<double>() : 0.0;
    // expanded_idx_to_permuted_idx: a seeded permutation of the pairs over act's rows, some slots -1.
    const int64_t P = k_.numel();
    act_rows_ = P + 8;  // a few padding rows no slot points at (the permuted buffer is padded per expert)
    perm_.resize(std::size_t(P));
    for (int64_t i = 0; i < P; ++i) perm_[std::size_t(i)] = int32_t(i);
    const uint64_t key = bld.key("perm");
    for (int64_t i = P - 1; i > 0; --i)
      std::swap(perm_[std::size_t(i)], perm_[std::size_t(hash_below(key, uint64_t(i), uint64_t(i + 1)))]);
    for (int64_t i = 0; i < P; ++i)
      if (inactive > 0 && double(hash_below(key + 1, uint64_t(i), 1000000)) < inactive * 1e6) perm_[std::size_t(i)] = -1;
    perm_idx_ = bld.ints("expanded_idx_to_permuted_idx", perm_.empty() ? std::vector<int32_t>{-1} : perm_);
    act_ = bld.random("act", dtype, {act_rows_, m.I}, 1.0f);
    const int Eg = m.shared ? 1 : m.E;
    const float as = 1.0f / std::sqrt(float(m.I)), bs = 1.0f / std::sqrt(float(std::max(1, k_.r)));
    tables_.add(bld, m.E, {moe_stacked(bld, o, "lora_a", dtype, k_, Eg, k_.r, m.I, true, as)},
                {moe_stacked(bld, o, "lora_b", dtype, k_, Eg, m.H, k_.r, false, bs)});
    ld_ = m.H + kGuardCols;
    out_ = bld.output("out", out_dtype_, {k_.M, ld_}, false, k_.M, ld_);
    HostTensor& y = tensors[std::size_t(out_)];
    for (std::size_t i = 0; i < y.numel(); ++i)
      if (int64_t(i % std::size_t(ld_)) >= m.H) y.must_keep[i] = 1;
    ws_bytes_ = std::max<std::size_t>(16, kernels::bgmv_moe_gemm2_workspace_bytes(args(nulls())));
    ws_ = bld.scratch("workspace", ws_bytes_);
  }
  kernels::BgmvMoeGemm2Args args(const std::vector<void*>& p) const {
    kernels::BgmvMoeGemm2Args a;
    fill(a, p);
    a.act = act_ < 0 ? nullptr : p[std::size_t(act_)];
    a.act_rows = act_rows_;
    a.perm = k_.ptr(p, perm_idx_);
    a.topk_weights = static_cast<const float*>(p[std::size_t(k_.w_idx)]);
    return a;
  }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  static void run_on(Backend& be, const kernels::BgmvMoeGemm2Args& a) {
    exec(be, a, kernels::launch_bgmv_moe_gemm2_lora_delta, [](const kernels::BgmvMoeGemm2Args& x) { ref::bgmv_moe_gemm2_lora_delta(x); });
  }
  void reference(const std::vector<void*>& p, bool naive) override {
    tables_.write_host(tensors, p);
    if (naive) ref::naive::bgmv_moe_gemm2_lora_delta(args(p)); else ref::bgmv_moe_gemm2_lora_delta(args(p));
  }
  // Pairs with a delta: an adapter, a valid expert and an active slot.
  std::map<std::pair<int, int>, int64_t> touched() const {
    std::map<std::pair<int, int>, int64_t> g;
    for (int64_t i = 0; i < k_.numel(); ++i) {
      const int l = k_.pair_slot(i);
      if (l >= 0 && perm_[std::size_t(i)] >= 0) ++g[{l, k_.local_expert(i)}];
    }
    return g;
  }
  std::string describe() const override {
    return "H=" + std::to_string(k_.cfg.H) + " I=" + std::to_string(k_.cfg.I) + " E=" + std::to_string(k_.cfg.E) +
           " top_k=" + std::to_string(k_.cfg.top_k) + " out=" + kernels::dtype_name(out_dtype_) +
           " pairs(adapter,expert)=" + std::to_string(touched().size());
  }
  std::string plan(const KernelChoice&) const override { return kernels::describe_bgmv_moe_gemm2_plan(args(nulls())); }
  DeltaShape shape() const {
    DeltaShape d;
    d.a_cols = k_.cfg.I;
    d.a_rows_per_r = 1;
    d.b_rows = k_.cfg.H;
    d.out_bytes = double(k_.M) * double(k_.cfg.H) * double(kernels::dtype_size(out_dtype_));
    return d;
  }
  Work work() const override {
    double rows = 0;
    for (const auto& [le, n] : touched()) rows += double(n);
    return delta_work(k_, touched(), rows, shape(), dtype, k_.cfg.shared);
  }
  Baseline baseline() const override { return delta_baseline(k_, touched(), shape()); }

 private:
  std::vector<int32_t> perm_;
  int64_t act_rows_ = 0;
  int act_ = -1, perm_idx_ = -1;
};

}  // namespace

void run_op(Backend& be, const kernels::BgmvMoeGemm2Args& a) { Gemm2Problem::run_on(be, a); }

namespace {
const RegisterOp kRegistered{moe_delta_spec<Gemm2Problem>(
      "bgmv_moe_gemm2_lora_delta", 150,
      "FlashInfer's FC2 MoE LoRA delta [T, H] = scale * sum_j w . B . round(A . act[perm]) over the token's "
      "slots, pointer tables",
      {"out_dtype", "inactive_slot_fraction"})};
}  // namespace

}  // namespace punica::bench
