// Host-only problem generator of the MoE LoRA tests (reference/moe_reference_test.cpp on the CPU,
// the moe_lora_align / fused_moe_lora GPU tests): routing with distinct experts per token,
// softmax-like weights, -1 tokens, disabled slots, an expert_map with non-local experts,
// out-of-range expert ids, mixed true ranks, NaN padding beyond them, shared (expert-broadcast)
// LoRA; and the visited-pair mask that says which output rows an op may touch.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>
#include "kernels/common/check.h"
#include "kernels/common/dtype.h"
#include "kernels/common/hash_rng.h"
#include "kernels/common/host_tensor.h"
#include "kernels/fused_moe_lora/fused_moe_lora.h"

namespace punica::kernels::moetest {

// The tests' one host tensor type (kernels/common/host_tensor.h).
using Tensor = HostTensor;

struct MoeCase {
  std::string name = "case";
  DType dtype = DType::bf16;
  DType inter = DType::bf16;       // intermediate_dtype (unset in the Args when equal to dtype)
  int M = 37, k = 2, E = 8;        // tokens, top_k, local experts
  int64_t K = 72, N = 40;          // A's input width, slice width
  int S = 2;                       // slices (2 gated w13, 1 non-gated / w2)
  bool w2 = false;                 // mul_routed_weight form (x row = pair)
  std::vector<int> ranks = {16, 8, 0, 16, 5};
  int R = 0;                       // max_rank (0 = max of ranks, at least 1)
  bool naive = false;
  int bs = 16;
  bool add_inputs = true;
  int64_t offset = 0, extra_cols = 0;  // y row = offset + S*N + extra_cols
  bool shared_a = false, shared_b = false;
  std::vector<int> disabled = {};  // slots with adapter_enabled = 0
  int none_pct = 20;               // tokens without an adapter
  int oor_pct = 0;                 // routed entries replaced by an out-of-range expert id
  bool expert_map = false;         // E_global = 2E, even global ids local (g/2), odd ones elsewhere
  int lora_ids_mode = 1;           // 0 null, 1 [-1, 0..L-1], 2 [0..L-2, L, -1] (slot L-1 not processed)
  bool nan_pad = false;            // NaN in A rows / B columns beyond the true ranks
  bool pad_sorted_ids = false;
  uint64_t seed = 1;
};

// gtest prints a parameter by its name, not its bytes.
inline void PrintTo(const MoeCase& c, std::ostream* os) { *os << c.name; }

struct MoeProblem {
  MoeCase c;
  int L = 0, R = 0, Eg = 0;
  int64_t numel = 0, ldy = 0, xrows = 0;
  Tensor x, y0;
  std::vector<Tensor> A, B;
  std::vector<float> w;
  std::vector<int32_t> topk, map, enabled, ranks, lora_ids, emap;
  // alignment buffers (host) and the routing made from them
  int64_t P = 0, Q = 0;
  std::vector<int32_t> sorted, eids, ntpp;

  // The fused op's Args on the host buffers here (routing must be set by the caller).
  FusedMoeLoraArgs args(void* y) const {
    FusedMoeLoraArgs a;
    a.dtype = c.dtype;
    if (c.inter != c.dtype) a.intermediate_dtype = c.inter;  // else the default: the output dtype
    a.num_tokens = c.M;
    a.top_k = c.k;
    a.hidden = c.K;
    a.x = x.data();
    a.x_row_stride = c.K;
    a.mul_routed_weight = c.w2;
    a.topk_weights = w.data();
    a.num_slices = c.S;
    for (int s = 0; s < c.S; ++s) {
      a.lora_a[s] = A[std::size_t(s)].data();
      a.lora_b[s] = B[std::size_t(s)].data();
    }
    a.shared_a = c.shared_a;
    a.shared_b = c.shared_b;
    a.num_experts = c.E;
    a.slice_width = c.N;
    a.max_loras = L;
    a.max_rank = R;
    a.lora_ranks = ranks.data();
    a.token_lora_mapping = map.data();
    a.adapter_enabled = enabled.data();
    a.y = y;
    a.y_row_stride = ldy;
    a.offset = c.offset;
    a.add_inputs = c.add_inputs;
    return a;
  }
  const int32_t* lora_ids_ptr() const { return c.lora_ids_mode == 0 ? nullptr : lora_ids.data(); }
  MoeLoraAlignArgs align_args() const {
    MoeLoraAlignArgs a;
    a.num_tokens = c.M;
    a.top_k = c.k;
    a.topk_ids = topk.data();
    a.token_lora_mapping = map.data();
    a.num_experts = c.expert_map ? Eg : c.E;
    a.expert_map = c.expert_map ? emap.data() : nullptr;
    a.block_size = c.bs;
    a.max_loras = L;
    a.adapter_enabled = enabled.data();
    a.lora_ids = lora_ids_ptr();
    a.naive = c.naive;
    a.pad_sorted_ids = c.pad_sorted_ids;
    a.max_padded = P;
    return a;
  }
};

inline MoeProblem make_problem(const MoeCase& c) {
  MoeProblem p;
  p.c = c;
  p.L = int(c.ranks.size());
  p.R = c.R ? c.R : std::max(1, *std::max_element(c.ranks.begin(), c.ranks.end()));
  p.Eg = c.expert_map ? 2 * c.E : c.E;
  p.numel = int64_t(c.M) * c.k;
  p.ldy = c.offset + c.S * c.N + c.extra_cols;
  p.xrows = c.w2 ? p.numel : c.M;
  const uint64_t key = hash_key(c.seed, hash_string(c.name), 0);
  p.x = Tensor(c.dtype, std::size_t(p.xrows * c.K));
  for (std::size_t i = 0; i < p.x.n; ++i) p.x.set(i, hash_uniform(key + 1, i));
  const int Ea = c.shared_a ? 1 : c.E, Eb = c.shared_b ? 1 : c.E;
  const float aamp = 1.f / std::sqrt(float(std::max<int64_t>(c.K, 1))), bamp = 1.f / std::sqrt(float(p.R));
  for (int s = 0; s < c.S; ++s) {
    Tensor a(c.dtype, std::size_t(p.L) * Ea * p.R * c.K), b(c.dtype, std::size_t(p.L) * Eb * c.N * p.R);
    for (std::size_t i = 0; i < a.n; ++i) a.set(i, aamp * hash_uniform(key + 10 + s, i));
    for (std::size_t i = 0; i < b.n; ++i) b.set(i, bamp * hash_uniform(key + 20 + s, i));
    for (int l = 0; l < p.L; ++l) {  // zero (or NaN) padding beyond the true rank, as vLLM lays it out
      const float pad = c.nan_pad ? std::numeric_limits<float>::quiet_NaN() : 0.f;
      for (int e = 0; e < Ea; ++e)
        for (int j = c.ranks[std::size_t(l)]; j < p.R; ++j)
          for (int64_t kk = 0; kk < c.K; ++kk) a.set(((std::size_t(l) * Ea + e) * p.R + j) * c.K + kk, pad);
      for (int e = 0; e < Eb; ++e)
        for (int64_t n = 0; n < c.N; ++n)
          for (int j = c.ranks[std::size_t(l)]; j < p.R; ++j) b.set(((std::size_t(l) * Eb + e) * c.N + n) * p.R + j, pad);
    }
    p.A.push_back(std::move(a));
    p.B.push_back(std::move(b));
  }
  // Routing: distinct experts per token over the global count, softmax-normalised weights.
  p.topk.resize(std::size_t(p.numel));
  p.w.resize(std::size_t(p.numel));
  for (int m = 0; m < c.M; ++m) {
    std::vector<int> pool(std::size_t(p.Eg));
    for (int e = 0; e < p.Eg; ++e) pool[std::size_t(e)] = e;
    double z = 0;
    for (int j = 0; j < c.k; ++j) {
      const int pick = j + int(hash_below(key + 3, uint64_t(m) * 64 + j, uint64_t(p.Eg - j)));
      std::swap(pool[std::size_t(j)], pool[std::size_t(pick)]);
      int id = pool[std::size_t(j)];
      if (int(hash_below(key + 4, uint64_t(m) * 64 + j, 100)) < c.oor_pct) id = p.Eg + int(hash_below(key + 5, uint64_t(m) * 64 + j, 3));
      p.topk[std::size_t(m) * c.k + j] = id;
      const double v = std::exp(2.0 * hash_uniform(key + 6, uint64_t(m) * 64 + j));
      p.w[std::size_t(m) * c.k + j] = float(v);
      z += v;
    }
    for (int j = 0; j < c.k; ++j) p.w[std::size_t(m) * c.k + j] = float(p.w[std::size_t(m) * c.k + j] / z);
  }
  p.map.resize(std::size_t(c.M));
  for (int m = 0; m < c.M; ++m)
    p.map[std::size_t(m)] = int(hash_below(key + 7, uint64_t(m), 100)) < c.none_pct
                                ? -1
                                : int32_t(hash_below(key + 8, uint64_t(m), uint64_t(p.L)));
  p.enabled.assign(std::size_t(p.L + 1), 1);
  for (int l : c.disabled) p.enabled[std::size_t(l)] = 0;
  p.ranks.assign(c.ranks.begin(), c.ranks.end());
  p.lora_ids.clear();
  if (c.lora_ids_mode == 1) {
    p.lora_ids.push_back(-1);
    for (int l = 0; l < p.L; ++l) p.lora_ids.push_back(l);
  } else if (c.lora_ids_mode == 2) {
    for (int l = 0; l + 1 < p.L; ++l) p.lora_ids.push_back(l);
    p.lora_ids.push_back(p.L);
    p.lora_ids.push_back(-1);
  } else {
    p.lora_ids.assign(std::size_t(p.L + 1), -1);
  }
  if (c.expert_map) {
    p.emap.resize(std::size_t(p.Eg));
    for (int g = 0; g < p.Eg; ++g) p.emap[std::size_t(g)] = g % 2 == 0 ? g / 2 : -1;
  }
  const MoeLoraAlignSizes sz = moe_lora_align_sizes(p.numel, p.c.expert_map ? p.Eg : c.E, c.bs, c.pad_sorted_ids);
  p.P = sz.max_padded;
  p.Q = sz.max_blocks;
  // Poisoned before the alignment so untouched slots are visible.
  p.sorted.assign(std::size_t(std::max<int64_t>(p.L * p.P, 1)), 0x5a5a);
  p.eids.assign(std::size_t(std::max<int64_t>(std::max<int64_t>(p.L * p.Q, p.numel), 1)), 0x3c3c);
  p.ntpp.assign(std::size_t(std::max(p.L, 1)), 0x7777);
  p.y0 = Tensor(c.dtype, std::size_t(c.M) * c.k * p.ldy);
  for (std::size_t i = 0; i < p.y0.n; ++i)
    p.y0.set(i, c.add_inputs ? hash_uniform(key + 9, i) : std::numeric_limits<float>::quiet_NaN());
  return p;
}

// Slice s of A cut to the rank rows [rho*rl, (rho+1)*rl) of every (slot, expert): what rank rho
// of a fully-sharded w13 holds. Needs an unshared A.
inline Tensor rank_slice_a(const MoeProblem& p, int s, int rho, int rl) {
  const Tensor& A = p.A[std::size_t(s)];
  Tensor t(p.c.dtype, std::size_t(p.L) * p.c.E * rl * p.c.K);
  for (int le = 0; le < p.L * p.c.E; ++le)
    for (int j = 0; j < rl; ++j)
      for (int64_t kk = 0; kk < p.c.K; ++kk)
        t.set((std::size_t(le) * rl + j) * p.c.K + kk, A.get((std::size_t(le) * p.R + rho * rl + j) * p.c.K + kk));
  return t;
}

// Which pairs carry a LoRA term (independent of the routing tensors): enabled slot, processed by
// the alignment (lora_ids), a local expert in [0, E).
inline std::vector<uint8_t> active_pairs(const MoeProblem& p) {
  std::vector<uint8_t> act(std::size_t(p.numel), 0);
  for (int64_t i = 0; i < p.numel; ++i) {
    const int l = p.map[std::size_t(i / p.c.k)];
    if (l < 0 || l >= p.L || !p.enabled[std::size_t(l)]) continue;
    if (p.c.lora_ids_mode != 0 && !p.c.naive &&
        std::find(p.lora_ids.begin(), p.lora_ids.end(), l) == p.lora_ids.end())
      continue;
    int g = p.topk[std::size_t(i)];
    const int Ek = p.c.expert_map ? p.Eg : p.c.E;
    if (g < 0 || g >= Ek) continue;
    const int e = p.c.expert_map ? p.emap[std::size_t(g)] : g;
    if (e < 0 || e >= p.c.E) continue;
    act[std::size_t(i)] = 1;
  }
  return act;
}
// Per element of y: 1 where the op writes (the pair's slice columns), 0 where y must stay bit-equal.
inline std::vector<uint8_t> written_mask(const MoeProblem& p) {
  const auto act = active_pairs(p);
  std::vector<uint8_t> m(p.y0.n, 0);
  for (int64_t i = 0; i < p.numel; ++i)
    if (act[std::size_t(i)])
      for (int64_t c = p.c.offset; c < p.c.offset + p.c.S * p.c.N; ++c) m[std::size_t(i * p.ldy + c)] = 1;
  return m;
}

// The odd-shape grid of the fused op (CPU reference test and GPU test): fp16/bf16 x {gated w13
// (H 72), non-gated w13, w2 (I 56)} x {naive, aligned bs 16/32/64}, with add_inputs on/off,
// offset 0/8, K / max_rank not multiples of 8 with bs 64, a disabled slot, -1 tokens, 10% out-of-range expert ids, expert_map, lora_ids
// variants, shared A (w13) / shared B (w2), pad_sorted_ids; mixed ranks {16, 8, 0, 16, 5}.
inline std::vector<MoeCase> odd_fused_cases() {
  std::vector<MoeCase> v;
  int n = 0;
  for (DType dt : {DType::bf16, DType::f16})
    for (int form = 0; form < 3; ++form)  // 0 gated w13, 1 non-gated w13, 2 w2
      for (int path = 0; path < 4; ++path) {  // naive, aligned bs 16 / 32 / 64
        MoeCase c;
        c.name = "fused" + std::to_string(n);
        c.seed = uint64_t(++n);
        c.dtype = c.inter = dt;
        c.S = form == 0 ? 2 : 1;
        c.w2 = form == 2;
        c.K = form == 2 ? 56 : 72;     // I or H: not multiples of 64
        if (path == 3) {               // the scalar paths: K and max_rank not multiples of 8
          c.K = form == 2 ? 57 : 75;
          c.ranks = {12, 5, 0, 12, 3};
        }
        c.N = form == 2 ? 72 : 28;
        c.naive = path == 0;
        c.bs = path == 0 ? 16 : 8 << path;
        c.add_inputs = (n % 3) != 0;
        c.offset = (n % 2) ? 8 : 0;
        c.extra_cols = 5;
        c.disabled = {1};
        c.oor_pct = 10;
        c.expert_map = !c.naive && (n % 4 == 1);
        c.lora_ids_mode = c.naive ? 0 : 1 + (n % 3 == 2);
        c.shared_a = form == 0 && n % 5 == 0;
        c.shared_b = form == 2 && n % 5 == 3;
        c.pad_sorted_ids = n % 2 == 0;
        v.push_back(c);
      }
  return v;
}

// The one call's scratch (fused_moe_lora_workspace_bytes: the intermediate, then the split-K
// shrink's tickets and fp32 parts) as a NaN-poisoned tensor of intermediate_dtype.
inline Tensor scratch_tensor(const MoeProblem& p) {
  const std::size_t bytes = fused_moe_lora_workspace_bytes(p.c.M, p.c.k, p.c.S, p.R, p.c.inter);
  Tensor ws(p.c.inter, std::max<std::size_t>(1, (bytes + dtype_size(p.c.inter) - 1) / dtype_size(p.c.inter)));
  for (std::size_t i = 0; i < ws.n; ++i) ws.set(i, NAN);
  return ws;
}

// The DESIGN §6 comparison (kernels/common/check.h, the kit the bench and every test share) over the
// written elements; the others must stay bit-equal to y0. Returns the number of wrong elements and
// appends a report.
inline std::size_t compare_y(const Tensor& got, const Tensor& ref, const Tensor& y0, const std::vector<uint8_t>& written,
                             double rtol, std::string& report) {
  CheckSpec spec;
  spec.dtype = ref.dtype;
  spec.n = ref.n;
  spec.y0 = y0.data();
  spec.keep = [&](std::size_t i) { return !written[i]; };
  spec.name = "y";
  const CheckResult r = check_close(got.data(), ref.data(), rtol, spec);
  for (const auto& m : r.first_mismatches) report += " " + m + ";";
  report += " max_abs=" + std::to_string(r.max_abs_err) + " nelems=" + std::to_string(r.nelems);
  return r.nwrong;
}

// An add_lora_w13 case of the w13 / w2 tests: top_k 4 of 16 experts, 5 slots, 10% out-of-range ids.
inline MoeCase w13_case(const std::string& name, int M, bool emap, int64_t H, int64_t I, int S, int bs) {
  MoeCase c;
  c.name = name;
  c.M = M;
  c.k = 4;
  c.E = 16;
  c.K = H;
  c.N = I;
  c.S = S;
  c.expert_map = emap;
  c.oor_pct = 10;
  c.bs = bs;
  return c;
}

// The w2 problem of add_lora_w2 after p's add_lora_w13: x = [M*k, I] per pair (I = p's N),
// B [L, E, H, r] (H = p's K), one slice, p's mapping, routing and weights.
inline MoeProblem w2_problem_after(const MoeProblem& p) {
  MoeCase c2 = p.c;
  c2.name += "_w2";
  c2.w2 = true;
  c2.S = 1;
  c2.K = p.c.N;
  c2.N = p.c.K;
  MoeProblem p2 = make_problem(c2);
  p2.map = p.map;
  p2.topk = p.topk;
  p2.w = p.w;
  return p2;
}

// compare_y of an add_lora_w13 / add_lora_w2 output whose path was `naive_path`: "" when it holds.
inline std::string w13_w2_mismatch(const Tensor& got, const Tensor& ref, const MoeProblem& p, bool naive_path) {
  MoeProblem q = p;
  q.c.naive = naive_path;
  std::string rep;
  const std::size_t wrong = compare_y(got, ref, p.y0, written_mask(q), rtol_for(p.c.dtype), rep);
  return wrong ? p.c.name + ": " + std::to_string(wrong) + " wrong;" + rep : "";
}

}  // namespace punica::kernels::moetest
