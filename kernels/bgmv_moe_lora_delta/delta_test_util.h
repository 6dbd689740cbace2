// Host side of the bgmv MoE LoRA delta checks (the GPU test bgmv_moe_lora_delta_test.cu and the CPU
// block emulator's delta_emu_check.cpp): a case, its routing (FlashInfer's test: the first half of
// the tokens with an adapter, distinct experts per token), per-slot true ranks, stacked weights with
// zero or NaN padding past them, and FlashInfer's fill_w_ptr tables over any base addresses.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/bgmv_moe_lora_delta/bgmv_moe_lora_delta.h"
#include "kernels/common/check.h"
#include "kernels/common/hash_rng.h"
#include "kernels/common/host_tensor.h"

namespace punica::kernels::deltatest {

struct DeltaCase {
  int64_t T = 16;
  int k = 2;
  int64_t H = 768, I = 768;
  int E = 8, L = 4;
  int rank = 16;
  std::vector<int> ranks;       // true rank per slot (cycled); empty = rank
  bool shared_a = false;        // gemm1 mode
  bool shared_experts = false;  // stride-0 expert dim
  DType lora = DType::bf16, out = DType::bf16;
  float scale = 0.5f;
  bool nan_pad = false;
  int64_t extra_ld = 0;         // ld_out = width + extra_ld
  double inactive = 0.0;        // gemm2: share of slots with perm = -1
  bool odd_ids = false;         // a slot >= L and an expert id >= E
  BgmvMoePath want = BgmvMoePath::pairs;
  std::string name() const {
    return "T" + std::to_string(T) + "k" + std::to_string(k) + "H" + std::to_string(H) + "I" + std::to_string(I) + "E" +
           std::to_string(E) + "L" + std::to_string(L) + "r" + std::to_string(rank) + (shared_a ? "sa" : "") +
           (shared_experts ? "se" : "") + dtype_name(lora) + "->" + dtype_name(out);
  }
};

inline HostTensor random_values(DType t, std::size_t n, uint64_t key) {
  HostTensor h(t, n);
  for (std::size_t i = 0; i < n; ++i) h.set(i, hash_uniform(key, i));
  return h;
}

// Inputs both ops share: the routing, the per-slot ranks, the stacked weights of each table row.
struct Inputs {
  std::vector<int32_t> lora_ids, topk, ranks;
  std::vector<HostTensor> A, B;  // per slice: [L, Eg, rank, K], [L, Eg, N, rank]
  int Eg = 1;
  Inputs(const DeltaCase& c, int S, int64_t K, int64_t N, uint64_t seed) {
    Eg = c.shared_experts ? 1 : c.E;
    for (int l = 0; l < c.L; ++l)
      ranks.push_back(c.ranks.empty() ? c.rank : c.ranks[std::size_t(l) % c.ranks.size()]);
    for (int64_t t = 0; t < c.T; ++t) {  // FlashInfer's test: the first half valid, the rest in [-1, L)
      const int v = int(hash_below(seed + 1, uint64_t(t), uint64_t(c.L + 1))) - 1;
      lora_ids.push_back(t < c.T / 2 ? std::max(v, 0) : v);
      std::vector<int> pool(static_cast<std::size_t>(c.E));
      for (int e = 0; e < c.E; ++e) pool[std::size_t(e)] = e;
      for (int j = 0; j < c.k; ++j) {  // distinct experts per token
        const std::size_t q = j + hash_below(seed + 2, uint64_t(t * 64 + j), uint64_t(c.E - j));
        std::swap(pool[std::size_t(j)], pool[q]);
        topk.push_back(pool[std::size_t(j)]);
      }
    }
    if (c.odd_ids && c.T >= 4) {
      lora_ids[1] = c.L;                    // a slot past L: no delta
      topk[std::size_t(2 * c.k)] = c.E + 1; // an expert id past E: no delta for that slot
    }
    const float as = 1.0f / std::sqrt(float(K)), bs = 1.0f / std::sqrt(float(c.rank));
    for (int s = 0; s < S; ++s) {
      HostTensor a(c.lora, std::size_t(c.L) * Eg * c.rank * K), b(c.lora, std::size_t(c.L) * Eg * N * c.rank);
      const float pad = c.nan_pad ? std::nanf("") : 0.0f;
      for (std::size_t i = 0; i < a.n; ++i) {
        const int l = int(i / (std::size_t(Eg) * c.rank * K)), j = int(i / K % c.rank);
        a.set(i, j < ranks[std::size_t(l)] ? as * hash_uniform(seed + 10 + s, i) : pad);
      }
      for (std::size_t i = 0; i < b.n; ++i) {
        const int l = int(i / (std::size_t(Eg) * N * c.rank)), j = int(i % c.rank);
        b.set(i, j < ranks[std::size_t(l)] ? bs * hash_uniform(seed + 20 + s, i) : pad);
      }
      A.push_back(std::move(a));
      B.push_back(std::move(b));
    }
  }
  // fill_w_ptr of every slice: entry (s, e) = base_s + e * expert stride bytes (0 for a shared dim).
  std::vector<int64_t> table(const std::vector<const void*>& bases, const std::vector<HostTensor>& ts, int E,
                             int64_t inner) const {
    std::vector<int64_t> t;
    for (std::size_t s = 0; s < bases.size(); ++s)
      for (int e = 0; e < E; ++e)
        t.push_back(int64_t(reinterpret_cast<uintptr_t>(bases[s])) +
                    (Eg == 1 ? 0 : int64_t(e) * inner * int64_t(dtype_size(ts[s].dtype))));
    return t;
  }
};


// One gemm1 call's host data; args() over the caller's pointers (device copies, or these for the
// reference), workspace unset.
struct Gemm1Host {
  DeltaCase c;
  int S;
  int64_t N, W, P, ld, ia, ib;
  Inputs in;
  HostTensor x;
  explicit Gemm1Host(const DeltaCase& cc)
      : c(cc), S(cc.shared_a ? 1 : 2), N(cc.shared_a ? 2 * cc.I : cc.I), W(2 * cc.I), P(cc.T * cc.k),
        ld(W + cc.extra_ld), ia(int64_t(cc.rank) * cc.H), ib(N * cc.rank),
        in(cc, S, cc.H, N, 4242 + uint64_t(cc.T) * 7 + uint64_t(cc.rank)),
        x(random_values(cc.lora, std::size_t(std::max<int64_t>(cc.T, 1) * cc.H), 77)) {}
  BgmvMoeGemm1Args args(const int64_t* ta, const int64_t* tb, const int32_t* ranks, const void* xp,
                        const int32_t* topk, const int32_t* lora, void* out) const {
    BgmvMoeGemm1Args a;
    a.lora_dtype = c.lora; a.out_dtype = c.out; a.scale = c.scale;
    a.num_tokens = c.T; a.top_k = c.k; a.hidden = c.H; a.intermediate = c.I; a.num_experts = c.E; a.max_loras = c.L;
    a.rank = c.rank; a.lora_ranks = ranks; a.shared_a = c.shared_a;
    a.w_ptr_a = ta; a.w_ptr_b = tb;
    a.lora_stride_a = int64_t(in.Eg) * ia; a.lora_stride_b = int64_t(in.Eg) * ib;
    a.x = xp; a.topk_ids = topk; a.lora_ids = lora; a.out = out; a.ld_out = ld;
    return a;
  }
  // Rows (pairs) without a delta: exactly +0.
  std::vector<char> zero_rows() const {
    std::vector<char> z(std::size_t(std::max<int64_t>(P, 1)), 0);
    for (int64_t p = 0; p < P; ++p) {
      const int l = in.lora_ids[std::size_t(p / c.k)], e = in.topk[std::size_t(p)];
      z[std::size_t(p)] = l < 0 || l >= c.L || e < 0 || e >= c.E;
    }
    return z;
  }
};

// One gemm2 call's host data: act rows permuted from the pairs (some slots -1), routing weights.
struct Gemm2Host {
  DeltaCase c;
  int64_t P, ld, rows, ia, ib;
  Inputs in;
  std::vector<int32_t> perm;
  std::vector<float> w;
  HostTensor act;
  explicit Gemm2Host(const DeltaCase& cc)
      : c(cc), P(cc.T * cc.k), ld(cc.H + cc.extra_ld), rows(cc.T * cc.k + 8), ia(int64_t(cc.rank) * cc.I),
        ib(cc.H * cc.rank), in(cc, 1, cc.I, cc.H, 9191 + uint64_t(cc.T) * 5 + uint64_t(cc.rank)),
        act(random_values(cc.lora, std::size_t(rows * cc.I), 78)) {
    perm.resize(std::size_t(P));
    for (int64_t i = 0; i < P; ++i) perm[std::size_t(i)] = int32_t(i);
    for (int64_t i = P - 1; i > 0; --i)
      std::swap(perm[std::size_t(i)], perm[std::size_t(hash_below(31, uint64_t(i), uint64_t(i + 1)))]);
    for (int64_t i = 0; i < P; ++i)
      if (double(hash_below(32, uint64_t(i), 1000)) < c.inactive * 1000) perm[std::size_t(i)] = -1;
    w.resize(std::size_t(std::max<int64_t>(P, 1)));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.1f + hash_uniform(33, i) * 0.05f;
  }
  BgmvMoeGemm2Args args(const int64_t* ta, const int64_t* tb, const int32_t* ranks, const void* actp,
                        const int32_t* permp, const float* wp, const int32_t* topk, const int32_t* lora, void* out) const {
    BgmvMoeGemm2Args a;
    a.lora_dtype = c.lora; a.out_dtype = c.out; a.scale = c.scale;
    a.num_tokens = c.T; a.top_k = c.k; a.hidden = c.H; a.intermediate = c.I; a.num_experts = c.E; a.max_loras = c.L;
    a.rank = c.rank; a.lora_ranks = ranks;
    a.w_ptr_a = ta; a.w_ptr_b = tb;
    a.lora_stride_a = int64_t(in.Eg) * ia; a.lora_stride_b = int64_t(in.Eg) * ib;
    a.act = actp; a.act_rows = rows; a.perm = permp; a.topk_weights = wp;
    a.topk_ids = topk; a.lora_ids = lora; a.out = out; a.ld_out = ld;
    return a;
  }
  // Tokens no slot contributes to: exactly +0.
  std::vector<char> zero_rows() const {
    std::vector<char> z(std::size_t(std::max<int64_t>(c.T, 1)), 0);
    for (int64_t t = 0; t < c.T; ++t) {
      bool any = false;
      const int l = in.lora_ids[std::size_t(t)];
      for (int j = 0; j < c.k; ++j) {
        const int64_t p = t * c.k + j;
        const int e = in.topk[std::size_t(p)];
        any = any || (l >= 0 && l < c.L && e >= 0 && e < c.E && perm[std::size_t(p)] >= 0 && in.ranks[std::size_t(l)] > 0);
      }
      z[std::size_t(t)] = !any;
    }
    return z;
  }
};

// A [rows, ld] output against the reference: columns < width within the LoRA dtype's tolerance (the
// rank-r intermediate is rounded to it, so an fp32 output is no more exact than that), the rest
// bit-equal to the NaN poison `init`; rows in zero_rows exactly +0.
struct OutputCheck {
  std::size_t nwrong = 0, nuntouched = 0;
  int64_t nonzero = 0;
  std::string first;
  bool ok() const { return nwrong == 0 && nonzero == 0; }
};
inline OutputCheck check_output(const HostTensor& got, const HostTensor& want, const HostTensor& init, DType lora,
                                int64_t rows, int64_t ld, int64_t width, const std::vector<char>& zero_rows) {
  OutputCheck o;
  CheckSpec spec;
  spec.dtype = got.dtype;
  spec.n = std::size_t(rows * ld);
  spec.y0 = init.data();
  spec.keep = [&](std::size_t e) { return int64_t(e % std::size_t(ld)) >= width; };
  const CheckResult r = check_close(got.data(), want.data(), std::max(rtol_for(got.dtype), rtol_for(lora)), spec);
  o.nwrong = r.nwrong;
  o.nuntouched = r.nuntouched;
  o.first = r.first_mismatches.empty() ? "" : r.first_mismatches[0];
  for (int64_t i = 0; i < rows; ++i)
    if (zero_rows[std::size_t(i)])
      for (int64_t c = 0; c < width; ++c) o.nonzero += got.bits(std::size_t(i * ld + c)) != 0;
  return o;
}

// The cases of the GPU test and the emulator (the emulator runs the small ones).
inline DeltaCase mk(int64_t T, int k, int64_t H, int64_t I, int E, int L, int rank, BgmvMoePath want) {
  DeltaCase c;
  c.T = T; c.k = k; c.H = H; c.I = I; c.E = E; c.L = L; c.rank = rank; c.want = want;
  return c;
}
constexpr BgmvMoePath kPairs = BgmvMoePath::pairs, kGrouped = BgmvMoePath::grouped;


}  // namespace punica::kernels::deltatest
