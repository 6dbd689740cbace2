// The kit of the FlashInfer MoE LoRA delta entries (bgmv_moe_gemm1_lora_delta,
// bgmv_moe_gemm2_lora_delta; SPEC §4.8): their scenario fields, FlashInfer's int64 pointer tables
// (fill_w_ptr layout) built for every rotated copy in prepare() (host addresses for the reference),
// and the floor / cuBLAS baseline over the (adapter, expert) pairs the batch touches.
#pragma once
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>
#include "apps/punica-bench/ops/moe_kit.h"
#include "kernels/bgmv_moe_lora_delta/bgmv_moe_lora_delta.h"
#include "reference/bgmv_moe_reference.h"

namespace punica::bench {

inline std::vector<FieldSpec> moe_delta_field_specs() {
  using nlohmann::json;
  return {
      FieldSpec{"shared_a", 216, json{{"type", "boolean"}},
                "bgmv_moe_gemm1_lora_delta's mode: false = regular ([2, E] pointer tables, separate gate and up A "
                "and B), true = FlashInfer's performant shared-A mode ([E] tables, one A [r, H], B fused [2I, r]). "
                "Default false."},
      FieldSpec{"out_dtype", 217, json{{"type", "string"}, {"enum", {"bf16", "fp16", "fp32"}}},
                "Output dtype of the FlashInfer MoE LoRA deltas (the delta is summed in fp32, times scale, rounded "
                "once). Default bf16 (FlashInfer's default); `dtype` is the LoRA dtype (x, act and the weights)."},
      FieldSpec{"inactive_slot_fraction", 227, json{{"type", "number"}, {"minimum", 0}, {"maximum", 1}},
                "bgmv_moe_gemm2_lora_delta: share of routed slots whose expanded_idx_to_permuted_idx entry is -1 "
                "(inactive: they add nothing). Default 0."},
  };
}
inline std::vector<FieldSpec> moe_delta_fields(const std::vector<std::string>& moe_names,
                                               const std::vector<std::string>& own) {
  std::vector<FieldSpec> out = moe_fields(moe_names);
  for (auto& f : moe_delta_field_specs())
    if (std::find(own.begin(), own.end(), f.name) != own.end()) out.push_back(f);
  return out;
}
inline DType delta_out_dtype(const Case& c) {
  DType d = DType::bf16;
  if (c.params.contains("out_dtype")) kernels::parse_dtype(c.params["out_dtype"].get<std::string>(), d);
  return d;
}

// FlashInfer's fill_w_ptr over a stacked [L, Eg, d1, d2] tensor (Eg = E, or 1 = stride-0 experts):
// entry e (of one slice) = address + e * expert stride bytes; returns the adapter stride (elements).
inline int64_t fill_w_ptr(int64_t* entries, int E, const void* base, const HostTensor& t) {
  const int64_t inner = t.shape[2] * t.shape[3];
  const int64_t estride = t.shape[1] == 1 ? 0 : inner;
  for (int e = 0; e < E; ++e)
    entries[e] = int64_t(reinterpret_cast<uintptr_t>(base)) + int64_t(e) * estride * int64_t(t.elem_bytes());
  return t.shape[1] * inner;
}

// The pointer-table tensors of a delta problem: scratch, rebuilt for every copy of the inputs.
struct DeltaTables {
  int a = -1, b = -1;                   // tensor indices of w_ptr_a / w_ptr_b
  std::vector<int> a_src, b_src;        // the stacked tensors of each table row (slice)
  int E = 0;
  void add(Builder& bld, int E_, const std::vector<int>& as, const std::vector<int>& bs) {
    E = E_;
    a_src = as;
    b_src = bs;
    a = bld.scratch("w_ptr_a", std::size_t(as.size()) * std::size_t(E) * 8);
    b = bld.scratch("w_ptr_b", std::size_t(bs.size()) * std::size_t(E) * 8);
  }
  // Host images of both tables for the tensors at pointers p (device or host addresses).
  std::pair<std::vector<int64_t>, std::vector<int64_t>> images(const std::vector<HostTensor>& ts,
                                                               const std::vector<void*>& p) const {
    std::vector<int64_t> ta(a_src.size() * std::size_t(E)), tb(b_src.size() * std::size_t(E));
    for (std::size_t s = 0; s < a_src.size(); ++s)
      fill_w_ptr(ta.data() + s * std::size_t(E), E, p[std::size_t(a_src[s])], ts[std::size_t(a_src[s])]);
    for (std::size_t s = 0; s < b_src.size(); ++s)
      fill_w_ptr(tb.data() + s * std::size_t(E), E, p[std::size_t(b_src[s])], ts[std::size_t(b_src[s])]);
    return {ta, tb};
  }
  void upload(Backend& be, const std::vector<HostTensor>& ts, const std::vector<void*>& p) const {
    const auto [ta, tb] = images(ts, p);
    be.upload(p[std::size_t(a)], ta.data(), ta.size() * 8);
    be.upload(p[std::size_t(b)], tb.data(), tb.size() * 8);
  }
  void write_host(const std::vector<HostTensor>& ts, const std::vector<void*>& p) const {
    const auto [ta, tb] = images(ts, p);
    std::memcpy(p[std::size_t(a)], ta.data(), ta.size() * 8);
    std::memcpy(p[std::size_t(b)], tb.data(), tb.size() * 8);
  }
  int64_t stride(const std::vector<HostTensor>& ts, bool of_a) const {
    const HostTensor& t = ts[std::size_t(of_a ? a_src.at(0) : b_src.at(0))];
    return t.shape[1] * t.shape[2] * t.shape[3];
  }
};

// The floor of a delta (README, "Floors and baselines"): x / act rows read for the pairs with a
// delta (gemm1: their distinct tokens), the A and B weights at true rank of the touched (adapter,
// expert) pairs (once per adapter with a stride-0 expert dim), every output element written
// (gemm1: all [T, k, 2I] rows, zero rows included; gemm2: [T, H]). FLOPs at true rank.
struct DeltaShape {
  int64_t a_cols = 0;       // A width (H | I)
  int64_t a_rows_per_r = 0; // A rank rows per unit of rank over all slices (2 regular, 1 shared-A / gemm2)
  int64_t b_rows = 0;       // B rows over all slices (2I | H)
  double out_bytes = 0;
};
inline Work delta_work(const MoeCommon& k, const std::map<std::pair<int, int>, int64_t>& touched, double xrows,
                       const DeltaShape& d, DType lora, bool shared_experts) {
  Work w;
  w.tokens = k.M;
  const double es = kernels::dtype_size(lora);
  std::map<int, char> slots;
  double rank_pairs = 0;
  for (const auto& [le, n] : touched) {
    const double rk = k.slot_rank[std::size_t(le.first)];
    rank_pairs += double(n) * rk;
    if (!shared_experts || !slots.count(le.first))
      w.bytes += rk * (double(d.a_rows_per_r) * double(d.a_cols) + double(d.b_rows)) * es;
    slots[le.first] = 1;
  }
  w.bytes += xrows * double(d.a_cols) * es + d.out_bytes;
  w.flops = 2.0 * rank_pairs * (double(d.a_rows_per_r) * double(d.a_cols) + double(d.b_rows));
  return w;
}
// cuBLAS grouped GEMMs of the same work (inputs permuted beforehand): the shrink per touched
// (adapter, expert) (m = its pairs, n = slices x rank, k = A width), the expand per touched
// (adapter, expert) (m = pairs, n = B rows, k = rank), written (beta = 0).
inline Baseline delta_baseline(const MoeCommon& k, const std::map<std::pair<int, int>, int64_t>& touched,
                               const DeltaShape& d) {
  MoeForm f;
  f.S = 1;
  f.K = d.a_cols;
  f.N = d.b_rows;
  Baseline bl;
  Baseline::Grouped shrink, expand;
  for (const auto& [le, n] : touched) {
    const int64_t rk = k.slot_rank[std::size_t(le.first)];
    if (rk <= 0) continue;
    shrink.groups.push_back({n, d.a_rows_per_r * rk, f.K});
    expand.groups.push_back({n, f.N, rk});
  }
  if (!shrink.groups.empty()) {
    bl.grouped.push_back(std::move(shrink));
    bl.grouped.push_back(std::move(expand));
  }
  return bl;
}

// The fields both deltas' Args share (A: BgmvMoeGemm1Args | BgmvMoeGemm2Args), from the problem's
// routing state, its tables and the tensors at pointers p (null pointers: shapes only).
template <class A>
void fill_delta_args(A& a, const MoeCommon& k, const DeltaTables& t, const std::vector<HostTensor>& ts,
                     const std::vector<void*>& p, DType lora, DType out_dtype, float scale, int out, int64_t ld, int ws,
                     std::size_t ws_bytes) {
  a.lora_dtype = lora;
  a.out_dtype = out_dtype;
  a.scale = scale;
  a.num_tokens = k.M;
  a.top_k = k.cfg.top_k;
  a.hidden = k.cfg.H;
  a.intermediate = k.cfg.I;
  a.num_experts = k.cfg.E;
  a.max_loras = k.L;
  a.rank = k.r;
  a.lora_ranks = k.ptr(p, k.ranks_idx);
  a.w_ptr_a = t.a < 0 ? nullptr : static_cast<const int64_t*>(p[std::size_t(t.a)]);
  a.w_ptr_b = t.b < 0 ? nullptr : static_cast<const int64_t*>(p[std::size_t(t.b)]);
  if (t.a >= 0) {
    a.lora_stride_a = t.stride(ts, true);
    a.lora_stride_b = t.stride(ts, false);
  }
  a.topk_ids = k.ptr(p, k.topk_idx);
  a.lora_ids = k.ptr(p, k.map_idx);
  a.out = out < 0 ? nullptr : p[std::size_t(out)];
  a.ld_out = ld;
  a.workspace = ws < 0 ? nullptr : p[std::size_t(ws)];
  a.workspace_bytes = ws_bytes;
}

// What both delta problems share: the routing state, the tables (rebuilt in prepare() for every copy
// of the inputs), the output and workspace tensors, the dtypes and the tolerance.
class DeltaProblem : public Problem {
 public:
  // The rank-r intermediate is rounded to the LoRA dtype: an fp32 output is no more exact than that.
  double rtol() const override { return std::max(default_rtol(out_dtype_), default_rtol(dtype)); }
  void prepare(Backend& be, const std::vector<void*>& p) override { tables_.upload(be, tensors, p); }

 protected:
  template <class A>
  void fill(A& a, const std::vector<void*>& p) const {
    fill_delta_args(a, k_, tables_, tensors, p, dtype, out_dtype_, scale_, out_, ld_, ws_, ws_bytes_);
  }
  // The launch on the backend: the kernel on CUDA, the Eigen reference on the CPU.
  template <class A, class K, class R>
  static void exec(Backend& be, const A& a, K kernel, R reference) {
    be.exec([&](void* s) { kernel(a, static_cast<cudaStream_t>(s)); }, [&] { reference(a); });
  }
  MoeCommon k_;
  DeltaTables tables_;
  DType out_dtype_ = DType::bf16;
  float scale_ = 1.0f;
  int64_t ld_ = 0;
  int out_ = -1, ws_ = -1;
  std::size_t ws_bytes_ = 0;
};

// The OpSpec of a delta entry: MoE sizes as the MoE ops (moe_require), 16-bit LoRA dtype.
template <class P>
OpSpec moe_delta_spec(const char* name, int order, const char* summary, const std::vector<std::string>& own) {
  // The MoE fields both deltas take (sizes from the preset or given, stride-0 experts, routing).
  const std::vector<std::string> moe_names = {"moe_intermediate", "num_experts", "top_k", "shared_lora", "routing"};
  OpSpec s = moe_spec<P>(name, order, summary, {}, -1);
  s.exclusive_fields = own;
  for (const auto& n : moe_names) s.exclusive_fields.push_back(n);
  s.fields = moe_delta_fields({}, own);
  s.require = [](CaseContext& x) { moe_require(x, true); };
  // One copy of the case's tensors (the size check before any case runs): x or act, the stacked A
  // and B (both slices), the [T, k, 2I] / [T, H] output and the workspaces, from above.
  s.bytes_needed = [](const Case& c) {
    const MoeConfig m = moe_config(c);
    const double es = double(kernels::dtype_size(c.dtype)), T = double(c.num_tokens), k = m.top_k;
    const double E = m.shared ? 1.0 : double(m.E), L = c.max_loras, r = c.max_rank;
    return es * (T * k * double(m.H + m.I) + 2 * L * E * r * double(m.H + 2 * m.I)) +
           4.0 * T * (k + 1) * double(2 * m.I + m.H + 64) + T * k * (2 * r + 16) * 4 + 1e6;
  };
  return s;
}

}  // namespace punica::bench
