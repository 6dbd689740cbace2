// vLLM's FusedMoEWithLoRA (SPEC §4.1, §4.7) as layer "fused_moe" of op "layer", written once
// against Backend (CUDA + NCCL, CPU + MPI). Per rank of a group of tp ranks:
//   base experts: x rows gathered per local expert -> w13 GEMM per expert -> back to pair order
//   (intermediate_cache1, [M, k, W13]) -> add_lora_w13 -> act_and_mul -> pair rows gathered per
//   expert -> w2 GEMM per expert -> back to pair order times the routing weight
//   (intermediate_cache3, [M, k, H]) -> add_lora_w2 -> moe_sum -> all_reduce over the group.
//   TP (§4.7): w13 rows and w2 columns sliced by I/tp; LoRA w13 B and w2 A likewise; fully sharded
//   (S-LoRA) slices w13 A by rank (shrink -> all_gather along the rank dim -> expand) and w2 B by
//   H/tp (shrink -> all_reduce -> expand at offset rho*H/tp).
//   EP (expert_parallel): the experts are split over the ranks (vLLM's linear placement, an
//   expert_map global -> local, -1 elsewhere) and not tensor-sharded; every rank sees every token
//   (the dispatch without an all-to-all backend) and the partial outputs meet in the all_reduce.
//   With token_subset each rank gets only the tokens routed to its experts, with their
//   token_lora_mapping passed explicitly (as after an all-to-all); its output rows are scattered
//   back into [T, H] before the all_reduce (the combine).
//   Layouts: gated (two LoRA slices gate | up), 3d (one slice whose B has 2*I rows [gate; up]),
//   3d_interleaved (GPT-OSS: gate and up interleaved by row, base w13 too), non-gated (up only, SiLU).
// Checked per rank against an unsharded fp64 layer computed from the hash at global indices:
// intermediate_cache1 after add_lora_w13 (the rank's columns of gate and up: concatenated over the
// ranks they give the full one) and the layer output after the all_reduce (the sum over ranks).
#include <algorithm>
#include <cmath>
#include <cstring>
#include "apps/punica-bench/layers/layers.h"
#include "apps/punica-bench/ops/exec.h"
#include "apps/punica-bench/ops/moe_kit.h"
#include "kernels/common/error.h"
#include "kernels/common/hash_rng.h"

namespace punica::bench {
namespace layers {

ExpertRange expert_range(int E, int ep, int rho) {
  const int base = E / ep, rem = E % ep;
  ExpertRange r;
  r.count = base + (rho < rem ? 1 : 0);
  r.first = rho * base + std::min(rho, rem);
  return r;
}

}  // namespace layers

namespace {

using kernels::DType;
using kernels::round_to;

enum class W13Layout { gated, concat3d, interleaved3d, nongated };

W13Layout w13_layout(const Case& c, bool gated) {
  if (!gated) return W13Layout::nongated;
  const std::string l = c.params.contains("w13_layout") ? c.params["w13_layout"].get<std::string>() : "gated";
  if (l == "3d") return W13Layout::concat3d;
  if (l == "3d_interleaved") return W13Layout::interleaved3d;
  return W13Layout::gated;
}

// The reference's owner of a global expert under EP (vLLM: E/ep per rank, the first E%ep ranks one
// more), written as a walk over the ranks apart from layers::expert_range.
int ref_owner(int E, int ep, int g, int* local) {
  int first = 0;
  for (int q = 0; q < ep; ++q) {
    const int n = E / ep + (q < E % ep ? 1 : 0);
    if (g >= first && g < first + n) { *local = g - first; return q; }
    first += n;
  }
  *local = -1;
  return -1;
}

class MoeLayer final : public Problem {
 public:
  MoeLayer(const Case& c, const BatchLayout& lay, const ProblemOptions& o, int rho)
      : c_(c), h_(c, o), rho_(rho), fault_(o.fault) {
    dtype = c.dtype;
    es_ = kernels::dtype_size(dtype);
    cfg_ = moe_config(c);
    G_ = std::max(1, c.tp);
    ep_ = c.params.contains("expert_parallel") && c.params["expert_parallel"].get<bool>();
    subset_ = c.params.contains("token_subset") && c.params["token_subset"].get<bool>();
    fs_ = c.fully_sharded && !ep_;
    layout_ = w13_layout(c, cfg_.gated);
    E_ = cfg_.E; k_ = cfg_.top_k; H_ = cfg_.H; I_ = cfg_.I;
    L_ = c.max_loras; r_ = c.max_rank;
    const int tpi = ep_ ? 1 : G_;  // the experts' tensor-parallel degree (1 under EP)
    Il_ = I_ / tpi;
    i0_ = ep_ ? 0 : int64_t(rho_) * Il_;
    W13_ = layout_ == W13Layout::nongated ? Il_ : 2 * Il_;
    S_ = layout_ == W13Layout::gated ? 2 : 1;
    N13_ = S_ == 2 ? Il_ : W13_;  // each w13 LoRA slice's width
    ra_ = fs_ ? r_ / G_ : r_;
    Hl_ = fs_ ? H_ / G_ : H_;
    if (ep_) {
      const auto er = layers::expert_range(E_, G_, rho_);
      e0_ = er.first; El_ = er.count;
      emap_.assign(std::size_t(E_), -1);
      for (int e = 0; e < El_; ++e) emap_[std::size_t(e0_ + e)] = fault_ == "moe_expert_map" ? (e + 1) % El_ : e;
    } else {
      e0_ = 0; El_ = E_;
    }

    // The batch's routing (moe_kit: distinct experts per token, softmax weights, ids past E) and
    // adapters, for the whole batch; the rank keeps all tokens or its subset.
    std::vector<HostTensor> tmp;
    Builder tb(c, o, tmp);
    MoeCommon mk;
    mk.init(c, lay, tb);
    slot_rank_ = mk.slot_rank;
    T_ = mk.M;
    for (int64_t t = 0; t < T_; ++t) {
      bool mine = !subset_;
      for (int j = 0; j < k_ && !mine; ++j) mine = local_expert_of(mk.topk[std::size_t(t * k_ + j)]) >= 0;
      if (mine) tok_.push_back(t);
    }
    M_ = int64_t(tok_.size());
    std::vector<int32_t> topk, map;
    std::vector<float> w;
    for (int64_t t : tok_) {
      map.push_back(mk.mapping[std::size_t(t)]);
      for (int j = 0; j < k_; ++j) {
        topk.push_back(mk.topk[std::size_t(t * k_ + j)]);
        w.push_back(mk.weights[std::size_t(t * k_ + j)]);
      }
    }
    topk_ = topk; map_ = map; wts_ = w; enabled_ = mk.enabled;
    const int64_t Mk = M_ * k_;

    Builder b(c, o, tensors);
    ranks_ = b.ints("lora_ranks", slot_rank_);
    map_idx_ = b.ints("token_lora_mapping", pad1(map));
    topk_idx_ = b.ints("topk_ids", pad1(topk, std::size_t(k_)));
    enabled_idx_ = b.ints("adapter_enabled", mk.enabled);
    lora_ids_idx_ = b.ints("lora_ids", mk.lora_ids);
    if (ep_) emap_idx_ = b.ints("expert_map", emap_);
    w_idx_ = f32("topk_weights", w, k_);
    if (fault_ == "moe_w2_weight_twice") {
      std::vector<float> w2(w);
      for (auto& v : w2) v *= v;
      wsq_idx_ = f32("topk_weights_squared", w2, k_);
    }
    if (fault_ == "moe_w2_lora_unweighted") ones_idx_ = f32("topk_weights_ones", std::vector<float>(w.size(), 1.f), k_);
    if (!subset_) mapping_tensor = map_idx_;  // --sample-rows: rows = tokens (a subset's y rows are all T)

    // The base plan: the rank's pairs grouped by local expert (host-built from the routing, untimed,
    // as vLLM's moe_align_block_size of the base experts).
    std::vector<int32_t> tok_of_sorted, pair_of_sorted, sorted_of_pair(std::size_t(std::max<int64_t>(Mk, 1)), -1);
    cnt_.assign(std::size_t(El_), 0);
    for (int e = 0; e < El_; ++e)
      for (int64_t i = 0; i < Mk; ++i)
        if (local_expert_of(topk[std::size_t(i)]) == e) {
          sorted_of_pair[std::size_t(i)] = int32_t(tok_of_sorted.size());
          tok_of_sorted.push_back(int32_t(i / k_));
          pair_of_sorted.push_back(int32_t(i));
          ++cnt_[std::size_t(e)];
        }
    P_ = int64_t(tok_of_sorted.size());
    tok_of_sorted_ = b.ints("moe.token_of_sorted", pad1(tok_of_sorted));
    pair_of_sorted_ = b.ints("moe.pair_of_sorted", pad1(pair_of_sorted));
    sorted_of_pair_ = b.ints("moe.sorted_of_pair", sorted_of_pair);
    if (subset_) {
      std::vector<int32_t> local_of_token(std::size_t(std::max<int64_t>(T_, 1)), -1);
      for (int64_t m = 0; m < M_; ++m) local_of_token[std::size_t(tok_[std::size_t(m)])] = int32_t(m);
      local_of_token_ = b.ints("moe.local_of_token", local_of_token);
    }

    // Inputs at global indices (a shard equals the slice of the full tensor).
    const uint64_t kx = key("x");
    x_ = gen("x", {std::max<int64_t>(M_, 1), H_}, [&](int64_t i) {
      const int64_t m = i / H_, h = i % H_;
      return m < M_ ? value(kx, uint64_t(tok_[std::size_t(m)] * H_ + h), 1.f) : 0.f;
    });
    const int64_t W13full = layout_ == W13Layout::nongated ? I_ : 2 * I_;
    const float s13 = 1.f / std::sqrt(float(H_)), s2 = 1.f / std::sqrt(float(I_));
    const float sb = 1.f / std::sqrt(float(std::max(1, r_)));
    const uint64_t kw13 = key("moe.w13"), kw2 = key("moe.w2");
    w13_ = gen("moe.w13.rank", {El_, W13_, H_}, [&](int64_t i) {
      const int64_t e = i / (W13_ * H_), q = i / H_ % W13_, h = i % H_;
      return value(kw13, uint64_t(((e0_ + e) * W13full + w13_row(q)) * H_ + h), s13);
    });
    w2_ = gen("moe.w2.rank", {El_, H_, Il_}, [&](int64_t i) {
      const int64_t e = i / (H_ * Il_), hh = i / Il_ % H_, cc = i % Il_;
      return value(kw2, uint64_t(((e0_ + e) * H_ + hh) * I_ + i0_ + cc), s2);
    });
    // LoRA, stacked per local expert (shared: expert dim 1 for w13 A and w2 B).
    const int Ea = cfg_.shared ? 1 : El_, Eag = cfg_.shared ? 1 : E_, Eb = cfg_.shared ? 1 : El_;
    for (int s = 0; s < S_; ++s) {
      const uint64_t ka = key("moe.w13_a." + std::to_string(s)), kb = key("moe.w13_b." + std::to_string(s));
      const int64_t j0 = fs_ ? int64_t(rho_) * ra_ : 0;
      a13_[s] = gen("moe.w13_a." + std::to_string(s) + ".rank", {L_, Ea, ra_, H_}, [&](int64_t i) {
        const int64_t l = i / (int64_t(Ea) * ra_ * H_), e = i / (ra_ * H_) % Ea, j = i / H_ % ra_, h = i % H_;
        const int64_t eg = cfg_.shared ? 0 : e0_ + e;
        return lora(ka, uint64_t(((l * Eag + eg) * r_ + j0 + j) * H_ + h), s13, j0 + j, int(l));
      });
      const int64_t Nfull = S_ == 2 ? I_ : W13full;
      const int64_t bi0 = fault_ == "moe_b_slice" ? 0 : i0_;  // fault: every rank takes rank 0's B rows
      b13_[s] = gen("moe.w13_b." + std::to_string(s) + ".rank", {L_, El_, N13_, r_}, [&](int64_t i) {
        const int64_t l = i / (int64_t(El_) * N13_ * r_), e = i / (N13_ * r_) % El_, q = i / r_ % N13_, j = i % r_;
        const int64_t row = S_ == 2 ? bi0 + q : w13_row(q);
        return lora(kb, uint64_t(((l * E_ + e0_ + e) * Nfull + row) * r_ + j), sb, j, int(l));
      });
    }
    {
      const uint64_t ka = key("moe.w2_a"), kb = key("moe.w2_b");
      a2_ = gen("moe.w2_a.rank", {L_, El_, r_, Il_}, [&](int64_t i) {
        const int64_t l = i / (int64_t(El_) * r_ * Il_), e = i / (r_ * Il_) % El_, j = i / Il_ % r_, cc = i % Il_;
        return lora(ka, uint64_t(((l * E_ + e0_ + e) * r_ + j) * I_ + i0_ + cc), s2, j, int(l));
      });
      const int64_t h0 = fs_ ? int64_t(rho_) * Hl_ : 0;
      const int Ebg = cfg_.shared ? 1 : E_;
      b2_ = gen("moe.w2_b.rank", {L_, Eb, Hl_, r_}, [&](int64_t i) {
        const int64_t l = i / (int64_t(Eb) * Hl_ * r_), e = i / (Hl_ * r_) % Eb, hh = i / r_ % Hl_, j = i % r_;
        const int64_t eg = cfg_.shared ? 0 : e0_ + e;
        return lora(kb, uint64_t(((l * Ebg + eg) * H_ + h0 + hh) * r_ + j), sb, j, int(l));
      });
    }

    // Outputs: intermediate_cache1 after add_lora_w13 and the layer output, both write-only.
    h1_ = nan_output("intermediate_cache1", {std::max<int64_t>(M_, 1), k_, W13_}, M_, int64_t(k_) * W13_);
    const int64_t yrows = subset_ ? T_ : M_;
    y_ = nan_output("y", {std::max<int64_t>(yrows, 1), H_}, yrows, H_);
    // Scratch of the base pipeline.
    const int64_t P1 = std::max<int64_t>(P_, 1), Mk1 = std::max<int64_t>(Mk, 1);
    xs_ = b.scratch("moe.x_sorted", std::size_t(P1 * H_) * es_);
    h1s_ = b.scratch("moe.w13_out_sorted", std::size_t(P1 * W13_) * es_);
    act_ = b.scratch("intermediate_cache2", std::size_t(Mk1 * Il_) * es_);
    as_ = b.scratch("moe.act_sorted", std::size_t(P1 * Il_) * es_);
    h3s_ = b.scratch("moe.w2_out_sorted", std::size_t(P1 * H_) * es_);
    h3_ = b.scratch("intermediate_cache3", std::size_t(Mk1 * H_) * es_);
    if (subset_) out_ = b.scratch("moe.out_local", std::size_t(std::max<int64_t>(M_, 1) * H_) * es_);
    grouped_ = c.params.contains("moe_base_gemm") && c.params["moe_base_gemm"].get<std::string>() == "grouped";
    if (grouped_) {
      table13_ = b.scratch("moe.w13_gemm_pointers", std::size_t(3 * std::max(El_, 1)) * sizeof(void*));
      table2_ = b.scratch("moe.w2_gemm_pointers", std::size_t(3 * std::max(El_, 1)) * sizeof(void*));
    }
    // Scratch of the LoRA part: the alignment's buffers (global expert count under EP) and the
    // fused op's intermediates.
    const int64_t M1 = std::max<int64_t>(M_, 1);
    const auto el = kernels::moe_lora_w13_routing_elems(M1, k_, E_, block_size(), L_, false);
    sorted_ = b.scratch("sorted_token_ids", std::size_t(std::max<int64_t>(el.sorted, 1)) * 4);
    eids_ = b.scratch("expert_ids", std::size_t(std::max<int64_t>(el.expert_ids, 1)) * 4);
    ntpp_ = b.scratch("num_tokens_post_pad", std::size_t(std::max<int64_t>(el.num_tokens_post_pad, 1)) * 4);
    align_ws_bytes_ = std::max<std::size_t>(16, kernels::moe_lora_align_workspace_bytes(M1, k_, E_, L_));
    align_ws_ = b.scratch("align_workspace", align_ws_bytes_);
    inter13_ = b.scratch("moe.lora_w13_intermediate",
                         std::max<std::size_t>(16, kernels::fused_moe_lora_workspace_bytes(M1, k_, S_, r_, dtype)));
    inter2_ = b.scratch("moe.lora_w2_intermediate",
                        std::max<std::size_t>(16, kernels::fused_moe_lora_workspace_bytes(M1, k_, 1, r_, dtype)));
    if (fs_) {
      const std::size_t part = std::size_t(S_) * std::size_t(Mk1) * std::size_t(ra_) * es_;
      shard_ = b.scratch("moe.w13_shrink_shard", part);
      gathered_ = b.scratch("moe.w13_shrink_gathered", part * std::size_t(G_));
      gather_tmp_ = b.scratch("moe.w13_gather_tmp", part * std::size_t(G_));
    }
    for (int32_t s : map_) if (s >= 0 && enabled_[std::size_t(s)]) ++lora_tokens_;
  }

  // ---- the forward ----
  void run(Backend& be, const std::vector<void*>& p) override {
    base_w13(be, p);
    lora_w13(be, p);
    base_w2(be, p);
    lora_w2(be, p);
    finish(be, p);
  }
  std::vector<Part> parts() override {
    std::vector<Part> v = {
        {"base", [this](Backend& be, const std::vector<void*>& p) { base_w13(be, p); base_w2(be, p); finish(be, p); }},
        {"lora", [this](Backend& be, const std::vector<void*>& p) { lora_w13(be, p); lora_w2(be, p); }},
        {"base_gemms", [this](Backend& be, const std::vector<void*>& p) {
           be.grouped_linear(gemms(p, true), table(p, true));
           be.grouped_linear(gemms(p, false), table(p, false));
         }}};
    if (G_ > 1) {
      v.push_back({"comm_base_all_reduce", [this](Backend& be, const std::vector<void*>& p) {
                     be.all_reduce_sum(p[std::size_t(y_)], dtype, std::size_t((subset_ ? T_ : M_) * H_), G_);
                   }});
      if (fs_) {
        v.push_back({"comm_all_gather", [this](Backend& be, const std::vector<void*>& p) { gather(be, p); }});
        v.push_back({"comm_all_reduce", [this](Backend& be, const std::vector<void*>& p) {
                       be.all_reduce_sum(p[std::size_t(inter2_)], dtype, std::size_t(M_ * k_ * r_), G_);
                     }});
      }
    }
    return v;
  }
  std::vector<Comm> comms() const override {
    if (G_ == 1) return {};
    std::vector<Comm> v = {{"all_reduce", double(subset_ ? T_ : M_) * double(H_) * double(es_), G_, "comm_base_all_reduce"}};
    if (fs_) {
      v.push_back({"all_gather", double(S_) * double(M_ * k_) * double(r_) * double(es_), G_, "comm_all_gather"});
      v.push_back({"all_reduce", double(M_ * k_) * double(r_) * double(es_), G_, "comm_all_reduce"});
    }
    return v;
  }
  std::string describe() const override {
    return "fused_moe " + layout_name() + (ep_ ? " ep " : " tp ") + std::to_string(G_) + " rank " + std::to_string(rho_) +
           (fs_ ? " fully sharded" : "") + (subset_ ? " token subset" : "") + ": experts [" + std::to_string(e0_) + ", " +
           std::to_string(e0_ + El_) + ") of " + std::to_string(E_) + ", I_local " + std::to_string(Il_) + ", tokens " +
           std::to_string(M_) + "/" + std::to_string(T_) + ", local pairs " + std::to_string(P_) + ", lora path " +
           (naive_path() ? "naive" : "aligned");
  }
  std::string plan(const KernelChoice&) const override {
    return std::string("fused_moe base=") + (grouped_ ? "cublas_grouped" : "cublas_per_expert") +
           " lora=" + (fs_ ? "split_shrink_expand" : "add_lora_w13+w2") +
           (naive_path() ? " naive" : " aligned bs=" + std::to_string(block_size()));
  }

  // Composite of many roundings (base GEMMs, LoRA deltas, activation, routing weight, moe_sum,
  // and for tp > 1 the per-rank partials before the dtype all_reduce): the row layer's widening.
  double rtol() const override {
    const double b = dtype == DType::f16 ? 5e-3 : dtype == DType::bf16 ? 1e-2 : 1e-5;
    return 2.0 * b * (G_ > 1 ? 2.0 : 1.0);
  }

  void reference(const std::vector<void*>& p, bool) override;

  Work work() const override {
    // The LoRA part's floor (as the dense layers): per touched (adapter, local expert) the A and B
    // blocks at true rank (a shared side once per adapter), x rows once per token with an adapter,
    // the pair rows of y read and written; w2 likewise on [M*k, I_local] -> [M, k, H_local].
    Work w;
    w.tokens = M_;
    std::map<std::pair<int, int>, int64_t> touched;
    std::map<int, int> slots;
    for (int64_t i = 0; i < M_ * k_; ++i) {
      const int l = map_[std::size_t(i / k_)];
      const int e = local_expert_of(topk_[std::size_t(i)]);
      if (l < 0 || e < 0 || !enabled_[std::size_t(l)]) continue;
      ++touched[{l, e}];
      slots[l] = 1;
    }
    const double es = double(es_);
    double pairs = 0;
    for (const auto& [le, n] : touched) {
      const double rk = slot_rank_[std::size_t(le.first)];
      pairs += double(n);
      w.bytes += rk * S_ * double(N13_) * es + rk * (double(Il_)) * es;  // w13 B, w2 A
      if (!cfg_.shared) w.bytes += rk * S_ * double(H_) * es / (fs_ ? G_ : 1) + rk * double(Hl_) * es;
      w.flops += 2.0 * double(n) * rk * (S_ * double(H_) / (fs_ ? G_ : 1) + S_ * double(N13_) + double(Il_) + double(Hl_));
    }
    if (cfg_.shared)
      for (const auto& [l, one] : slots) {
        const double rk = slot_rank_[std::size_t(l)];
        w.bytes += rk * S_ * double(H_) * es / (fs_ ? G_ : 1) + rk * double(Hl_) * es;
      }
    w.bytes += double(lora_tokens_) * double(H_) * es + 2.0 * pairs * S_ * double(N13_) * es;
    w.bytes += pairs * double(Il_) * es + 2.0 * pairs * double(Hl_) * es;
    w.base_gemm_flops = 2.0 * double(P_) * (double(W13_) * double(H_) + double(H_) * double(Il_));
    return w;
  }
  // cuBLAS grouped GEMMs of the base experts (one call per step over the local experts): what the
  // per-expert GEMMs of the base part would take as one grouped call.
  Baseline baseline() const override {
    Baseline bl;
    Baseline::Grouped g13, g2;
    for (int e = 0; e < El_; ++e) {
      const int64_t n = cnt_[std::size_t(e)];
      if (n == 0) continue;
      g13.groups.push_back({n, W13_, H_});
      g2.groups.push_back({n, H_, Il_});
    }
    if (!g13.groups.empty()) { bl.grouped.push_back(g13); bl.grouped.push_back(g2); }
    return bl;
  }

 private:
  // ---- helpers ----
  int local_expert_of(int g) const {
    if (g < 0 || g >= E_) return -1;
    if (!ep_) return g;
    return emap_[std::size_t(g)];
  }
  int block_size() const { return cfg_.block_size; }
  bool naive_path() const { return kernels::moe_lora_use_naive(M_, k_, El_, L_, ep_); }
  std::string layout_name() const {
    switch (layout_) {
      case W13Layout::gated: return "gated";
      case W13Layout::concat3d: return "3d";
      case W13Layout::interleaved3d: return "3d_interleaved";
      default: return "non-gated";
    }
  }
  // Row of the full base w13 (and of a 3-D LoRA B) behind local row q of this rank's w13 output.
  int64_t w13_row(int64_t q) const {
    switch (layout_) {
      case W13Layout::nongated: return i0_ + q;
      case W13Layout::interleaved3d: return 2 * (i0_ + q / 2) + q % 2;
      default: return q < Il_ ? i0_ + q : I_ + i0_ + (q - Il_);
    }
  }
  uint64_t key(const std::string& n) const { return h_.key(n); }
  float value(uint64_t k, uint64_t i, float scale) const { return round_to(dtype, h_.value(k, i, scale)); }
  // A LoRA element at rank index j of slot l: 0 (NaN with --nan-padding) past the slot's true rank.
  float lora(uint64_t k, uint64_t i, float scale, int64_t j, int l) const {
    if (j >= slot_rank_[std::size_t(l)]) return h_.stacked(k, i, scale, j, slot_rank_[std::size_t(l)], false);
    return value(k, i, scale);
  }
  template <class V>
  static V pad1(V v, std::size_t n = 1) {
    if (v.empty()) v.resize(n);
    return v;
  }
  int gen(const std::string& name, std::vector<int64_t> shape, const std::function<float(int64_t)>& fn) {
    HostTensor t;
    t.name = name; t.dtype = dtype; t.shape = std::move(shape); t.role = Role::input;
    t.data.resize(t.bytes());
    layers::parallel_for(int64_t(t.numel()), [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) kernels::store_elem(t.data.data(), dtype, std::size_t(i), fn(i));
    });
    tensors.push_back(std::move(t));
    return int(tensors.size()) - 1;
  }
  int f32(const std::string& name, const std::vector<float>& v, int cols) {
    HostTensor t;
    t.name = name; t.dtype = DType::f32; t.role = Role::input;
    t.shape = {std::max<int64_t>(int64_t(v.size()) / cols, 1), cols};
    t.data.assign(t.bytes(), 0);
    if (!v.empty()) std::memcpy(t.data.data(), v.data(), v.size() * 4);
    tensors.push_back(std::move(t));
    return int(tensors.size()) - 1;
  }
  int nan_output(const std::string& name, std::vector<int64_t> shape, int64_t rows, int64_t inner) {
    HostTensor t;
    t.name = name; t.dtype = dtype; t.shape = std::move(shape); t.role = Role::output;
    t.data.resize(t.bytes());
    for (std::size_t e = 0; e < t.numel(); ++e) reinterpret_cast<uint16_t*>(t.data.data())[e] = uint16_t(kernels::nan_bits(dtype));
    t.rows = std::max<int64_t>(rows, 1); t.inner = inner;
    t.must_keep.assign(t.numel(), 0);
    tensors.push_back(std::move(t));
    return int(tensors.size()) - 1;
  }
  const int32_t* ip(const std::vector<void*>& p, int i) const { return i < 0 ? nullptr : static_cast<const int32_t*>(p[std::size_t(i)]); }
  int32_t* mp(const std::vector<void*>& p, int i) const { return static_cast<int32_t*>(p[std::size_t(i)]); }

  // The expert GEMMs of one step: w13 (x sorted -> w13 out sorted) or w2 (act sorted -> w2 out sorted).
  std::vector<LinearArgs> gemms(const std::vector<void*>& p, bool w13) const {
    std::vector<LinearArgs> g;
    int64_t off = 0;
    const int64_t K = w13 ? H_ : Il_, N = w13 ? W13_ : H_;
    const char* x = static_cast<const char*>(p[std::size_t(w13 ? xs_ : as_)]);
    const char* w = static_cast<const char*>(p[std::size_t(w13 ? w13_ : w2_)]);
    char* y = static_cast<char*>(p[std::size_t(w13 ? h1s_ : h3s_)]);
    for (int e = 0; e < El_; ++e) {
      const int64_t n = cnt_[std::size_t(e)];
      if (n > 0) {
        LinearArgs la;
        la.dtype = dtype; la.m = n; la.n = N; la.k = K;
        la.x = x + std::size_t(off * K) * es_;
        la.w = w + std::size_t(int64_t(e) * N * K) * es_;
        la.y = y + std::size_t(off * N) * es_;
        la.ldy = N;
        g.push_back(la);
      }
      off += n;
    }
    return g;
  }
  // moe_base_gemm grouped: the device pointer table of the step's cuBLAS grouped GEMM; null = one
  // GEMM per expert.
  void* table(const std::vector<void*>& p, bool w13) const {
    const int t = w13 ? table13_ : table2_;
    return t < 0 ? nullptr : p[std::size_t(t)];
  }
  void base_w13(Backend& be, const std::vector<void*>& p) {
    be.gather_rows(p[std::size_t(xs_)], p[std::size_t(x_)], ip(p, tok_of_sorted_), nullptr, dtype, P_, H_, H_, H_);
    be.grouped_linear(gemms(p, true), table(p, true));
    be.gather_rows(p[std::size_t(h1_)], p[std::size_t(h1s_)], ip(p, sorted_of_pair_), nullptr, dtype, M_ * k_, W13_, W13_,
                   W13_);
  }
  void base_w2(Backend& be, const std::vector<void*>& p) {
    const kernels::MoeAct act = layout_ == W13Layout::nongated      ? kernels::MoeAct::silu
                                : layout_ == W13Layout::interleaved3d ? kernels::MoeAct::gated_interleaved
                                                                      : kernels::MoeAct::gated_halves;
    be.moe_activation(p[std::size_t(act_)], p[std::size_t(h1_)], dtype, M_ * k_, Il_, act);
    be.gather_rows(p[std::size_t(as_)], p[std::size_t(act_)], ip(p, pair_of_sorted_), nullptr, dtype, P_, Il_, Il_, Il_);
    be.grouped_linear(gemms(p, false), table(p, false));
    const int wi = wsq_idx_ >= 0 ? wsq_idx_ : w_idx_;
    be.gather_rows(p[std::size_t(h3_)], p[std::size_t(h3s_)], ip(p, sorted_of_pair_),
                   static_cast<const float*>(p[std::size_t(wi)]), dtype, M_ * k_, H_, H_, H_);
  }
  void finish(Backend& be, const std::vector<void*>& p) {
    if (!subset_) {
      be.moe_sum(p[std::size_t(y_)], p[std::size_t(h3_)], dtype, M_, k_, H_);
      be.all_reduce_sum(p[std::size_t(y_)], dtype, std::size_t(M_ * H_), G_);
      return;
    }
    be.moe_sum(p[std::size_t(out_)], p[std::size_t(h3_)], dtype, M_, k_, H_);
    // The combine: the rank's rows back at their tokens ([T, H], 0 elsewhere), summed over ranks.
    be.gather_rows(p[std::size_t(y_)], p[std::size_t(out_)], ip(p, local_of_token_), nullptr, dtype, T_, H_, H_, H_);
    be.all_reduce_sum(p[std::size_t(y_)], dtype, std::size_t(T_ * H_), G_);
  }

  // ---- the LoRA part (the registry entries' paths) ----
  kernels::FusedMoeLoraArgs op13(const std::vector<void*>& p) const {
    kernels::FusedMoeLoraArgs a;
    a.dtype = dtype;
    a.num_tokens = M_; a.top_k = k_; a.hidden = H_; a.x = p[std::size_t(x_)]; a.x_row_stride = H_;
    a.mul_routed_weight = false;
    a.topk_weights = static_cast<const float*>(p[std::size_t(w_idx_)]);
    a.num_slices = S_;
    for (int s = 0; s < S_; ++s) { a.lora_a[s] = p[std::size_t(a13_[s])]; a.lora_b[s] = p[std::size_t(b13_[s])]; }
    a.shared_a = cfg_.shared;
    a.num_experts = El_; a.slice_width = N13_; a.max_loras = L_; a.max_rank = r_;
    a.lora_ranks = ip(p, ranks_);
    a.token_lora_mapping = ip(p, map_idx_);  // explicit (the rank-local subset's under token_subset)
    a.adapter_enabled = ip(p, enabled_idx_);
    a.y = p[std::size_t(h1_)]; a.y_row_stride = W13_; a.offset = 0; a.add_inputs = true;
    a.intermediate = p[std::size_t(inter13_)];
    return a;
  }
  kernels::AddLoraW13Args w13_args(const std::vector<void*>& p) const {
    kernels::AddLoraW13Args w;
    w.op = op13(p);
    w.topk_ids = ip(p, topk_idx_);
    w.expert_map = ip(p, emap_idx_);
    w.num_experts_global = ep_ ? E_ : 0;
    w.block_size = block_size();
    w.lora_ids = ip(p, lora_ids_idx_);
    w.sorted_token_ids = mp(p, sorted_);
    w.expert_ids = mp(p, eids_);
    w.num_tokens_post_pad = mp(p, ntpp_);
    w.workspace = p[std::size_t(align_ws_)];
    w.workspace_bytes = align_ws_bytes_;
    return w;
  }
  void lora_w13(Backend& be, const std::vector<void*>& p) {
    const kernels::AddLoraW13Args w = w13_args(p);
    if (!fs_) {
      run_op(be, w);
      return;
    }
    // Fully sharded (S-LoRA): the alignment as add_lora_w13 runs it, then shrink with the rank's A
    // rows -> all_gather along the rank dim -> expand with B_rho.
    const kernels::MoeLoraRouting rt = kernels::moe_lora_w13_routing(w);
    if (!rt.naive) run_op(be, kernels::moe_lora_w13_align_args(w));
    kernels::FusedMoeLoraArgs s = w.op;
    s.routing = rt;
    s.a_rank = ra_;
    s.a_rank_offset = rho_ * ra_;
    s.intermediate = p[std::size_t(shard_)];
    run_fused_moe_lora_shrink(be, s);
    gather(be, p);
    kernels::FusedMoeLoraArgs e = w.op;
    e.routing = rt;
    e.intermediate = p[std::size_t(gathered_)];
    run_fused_moe_lora_expand(be, e);
  }
  // [S, M*k, r/tp] -> [S, M*k, r] in rank order along the last dim. The 16-bit elements move as
  // 32-bit words (an all-gather does no arithmetic), so (r/tp) * 2 bytes must be a multiple of 4
  // (the scenario hooks skip other cases).
  void gather(Backend& be, const std::vector<void*>& p) {
    const int64_t rows = int64_t(S_) * M_ * k_, words = ra_ * int64_t(es_) / 4;
    if (rows == 0) return;
    auto* in = static_cast<const float*>(p[std::size_t(shard_)]);
    auto* out = static_cast<float*>(p[std::size_t(gathered_)]);
    auto* tmp = static_cast<float*>(p[std::size_t(gather_tmp_)]);
    if (fault_ == "moe_gather_order" && G_ > 1) {  // the gathered rank blocks left leading: [tp][rows][cols]
      be.all_gather_f32(in, out, std::size_t(rows * words), G_);
      return;
    }
    be.all_gather_last_dim_f32(in, out, tmp, rows, words, G_);
  }
  void lora_w2(Backend& be, const std::vector<void*>& p) {
    const kernels::AddLoraW13Args w = w13_args(p);
    kernels::FusedMoeLoraArgs a;
    a.dtype = dtype;
    a.num_tokens = M_; a.top_k = k_; a.hidden = Il_; a.x = p[std::size_t(act_)]; a.x_row_stride = Il_;
    a.mul_routed_weight = true;
    a.topk_weights = static_cast<const float*>(p[std::size_t(ones_idx_ >= 0 ? ones_idx_ : w_idx_)]);
    a.num_slices = 1;
    a.lora_a[0] = p[std::size_t(a2_)]; a.lora_b[0] = p[std::size_t(b2_)];
    a.shared_b = cfg_.shared;
    a.num_experts = El_; a.slice_width = Hl_; a.max_loras = L_; a.max_rank = r_;
    a.lora_ranks = ip(p, ranks_);
    a.token_lora_mapping = ip(p, map_idx_);
    a.adapter_enabled = ip(p, enabled_idx_);
    a.routing = kernels::moe_lora_w13_routing(w);  // what add_lora_w13 returned (reused, SPEC §4.6)
    a.y = p[std::size_t(h3_)]; a.y_row_stride = H_;
    a.offset = fs_ && fault_ != "moe_w2_offset" ? int64_t(rho_) * Hl_ : 0;
    a.add_inputs = true;
    a.intermediate = p[std::size_t(inter2_)];
    if (!fs_) {
      run_add_lora_w2(be, a);
      return;
    }
    // Fully sharded: shrink of the rank's I columns (a partial of A . x) -> all_reduce -> expand
    // into the rank's H/tp columns.
    run_fused_moe_lora_shrink(be, a);
    be.all_reduce_sum(p[std::size_t(inter2_)], dtype, std::size_t(M_ * k_ * r_), G_);
    run_fused_moe_lora_expand(be, a);
  }

  Case c_;
  HashValues h_;
  int rho_;
  std::string fault_;
  std::size_t es_ = 2;
  MoeConfig cfg_;
  W13Layout layout_ = W13Layout::gated;
  int G_ = 1, E_ = 0, k_ = 1, L_ = 0, r_ = 0, S_ = 2, ra_ = 0, e0_ = 0, El_ = 0;
  bool ep_ = false, subset_ = false, fs_ = false, grouped_ = false;
  int64_t H_ = 0, I_ = 0, Il_ = 0, i0_ = 0, W13_ = 0, N13_ = 0, Hl_ = 0, T_ = 0, M_ = 0, P_ = 0;
  std::vector<int32_t> slot_rank_, emap_, topk_, map_, enabled_;
  std::vector<float> wts_;
  std::vector<int64_t> tok_, cnt_;
  int64_t lora_tokens_ = 0;
  int ranks_ = -1, map_idx_ = -1, topk_idx_ = -1, enabled_idx_ = -1, lora_ids_idx_ = -1, emap_idx_ = -1, w_idx_ = -1,
      wsq_idx_ = -1, ones_idx_ = -1;
  int tok_of_sorted_ = -1, pair_of_sorted_ = -1, sorted_of_pair_ = -1, local_of_token_ = -1;
  int x_ = -1, w13_ = -1, w2_ = -1, a13_[2] = {-1, -1}, b13_[2] = {-1, -1}, a2_ = -1, b2_ = -1, h1_ = -1, y_ = -1;
  int xs_ = -1, h1s_ = -1, act_ = -1, as_ = -1, h3s_ = -1, h3_ = -1, out_ = -1, table13_ = -1, table2_ = -1;
  int sorted_ = -1, eids_ = -1, ntpp_ = -1, align_ws_ = -1, inter13_ = -1, inter2_ = -1, shard_ = -1, gathered_ = -1,
      gather_tmp_ = -1;
  std::size_t align_ws_bytes_ = 0;
};

// The unsharded layer in fp64 (rounded where the pipeline stores 16-bit values), from the hash at
// global indices: nothing of the rank's plan (slices, expert placement, sorted order) is used, only
// the case, the routing and the rank's index.
void MoeLayer::reference(const std::vector<void*>& p, bool) {
  const DType dt = dtype;
  const bool gated = layout_ != W13Layout::nongated;
  const int64_t Wfull = gated ? 2 * I_ : I_;
  const float s13 = 1.f / std::sqrt(float(H_)), s2 = 1.f / std::sqrt(float(I_));
  const float sb = 1.f / std::sqrt(float(std::max(1, r_)));
  const uint64_t kx = key("x"), kw13 = key("moe.w13"), kw2 = key("moe.w2");
  const uint64_t ka13[2] = {key("moe.w13_a.0"), key("moe.w13_a.1")}, kb13[2] = {key("moe.w13_b.0"), key("moe.w13_b.1")};
  const uint64_t ka2 = key("moe.w2_a"), kb2 = key("moe.w2_b");
  const bool two = layout_ == W13Layout::gated;
  // Storage row of logical gate (part 0) / up (part 1) feature i in the full base w13 and 3-D B.
  auto store_row = [&](int part, int64_t i) -> int64_t {
    if (!gated) return i;
    if (layout_ == W13Layout::interleaved3d) return 2 * i + part;
    return part * I_ + i;
  };
  // This rank's share: the expert owner (EP) and its I columns (TP), from the case.
  const bool ep = ep_;
  const int tpi = ep ? 1 : G_;
  const int64_t Iloc = I_ / tpi, ibeg = ep ? 0 : int64_t(rho_) * Iloc;
  auto on_rank = [&](int g) {
    if (g < 0 || g >= E_) return false;
    if (!ep) return true;
    int loc = -1;
    return ref_owner(E_, G_, g, &loc) == rho_;
  };
  // The local tokens (all, or those with an expert on this rank), as the reference sees them.
  std::vector<int64_t> toks;
  // Full experts' weights, generated on first use.
  std::vector<std::vector<float>> W13(static_cast<std::size_t>(E_)), W2(static_cast<std::size_t>(E_));
  auto expert = [&](int g) {
    if (!W13[std::size_t(g)].empty()) return;
    auto& a = W13[std::size_t(g)];
    a.resize(std::size_t(Wfull * H_));
    layers::parallel_for(Wfull, [&](int64_t r0, int64_t r1) {
      for (int64_t q = r0; q < r1; ++q)
        for (int64_t h = 0; h < H_; ++h)
          a[std::size_t(q * H_ + h)] = value(kw13, uint64_t((int64_t(g) * Wfull + q) * H_ + h), s13);
    });
    auto& b = W2[std::size_t(g)];
    b.resize(std::size_t(H_ * I_));
    layers::parallel_for(H_, [&](int64_t r0, int64_t r1) {
      for (int64_t q = r0; q < r1; ++q)
        for (int64_t i = 0; i < I_; ++i) b[std::size_t(q * I_ + i)] = value(kw2, uint64_t((int64_t(g) * H_ + q) * I_ + i), s2);
    });
  };
  // Routing of the whole batch, regenerated (moe_kit's generator) for the subset's global tokens.
  std::vector<HostTensor> tmp;
  Builder tb(c_, ProblemOptions{}, tmp);
  MoeCommon mk;
  mk.init(c_, make_layout(c_), tb);
  for (int64_t t = 0; t < mk.M; ++t) {
    bool mine = !subset_;
    for (int j = 0; j < k_ && !mine; ++j) mine = on_rank(mk.topk[std::size_t(t * k_ + j)]);
    if (mine) toks.push_back(t);
  }
  // Which rows to compute: every token of y (subset: all T), sampled ones with --sample-rows.
  const int64_t yrows = subset_ ? mk.M : int64_t(toks.size());
  std::vector<char> need(static_cast<std::size_t>(mk.M), 0);
  for (int64_t r = 0; r < yrows; ++r)
    if (row_sample.empty() || (std::size_t(r) < row_sample.size() && row_sample[std::size_t(r)]))
      need[std::size_t(subset_ ? r : toks[std::size_t(r)])] = 1;
  if (subset_)  // intermediate_cache1 rows of the local tokens too
    for (int64_t t : toks) need[std::size_t(t)] = 1;
  for (int64_t t = 0; t < mk.M; ++t)
    if (need[std::size_t(t)])
      for (int j = 0; j < k_; ++j) {
        const int g = mk.topk[std::size_t(t * k_ + j)];
        if (g >= 0 && g < E_) expert(g);
      }
  std::vector<int64_t> local_row(static_cast<std::size_t>(mk.M), -1);
  for (std::size_t m = 0; m < toks.size(); ++m) local_row[std::size_t(toks[m])] = int64_t(m);
  const int64_t Wloc = gated ? 2 * Iloc : Iloc;
  std::vector<int64_t> todo;
  for (int64_t t = 0; t < mk.M; ++t) if (need[std::size_t(t)]) todo.push_back(t);
  layers::parallel_for(int64_t(todo.size()), [&](int64_t q0, int64_t q1) {
    std::vector<float> x(static_cast<std::size_t>(H_)), act(static_cast<std::size_t>(I_));
    std::vector<double> yacc(static_cast<std::size_t>(H_));
    std::vector<float> gate(static_cast<std::size_t>(I_)), up(static_cast<std::size_t>(I_));
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t t = todo[std::size_t(q)];
      for (int64_t h = 0; h < H_; ++h) x[std::size_t(h)] = value(kx, uint64_t(t * H_ + h), 1.f);
      const int l = mk.mapping[std::size_t(t)];
      const bool has_lora = l >= 0 && mk.enabled[std::size_t(l)] != 0;
      const int ra = has_lora ? slot_rank_[std::size_t(l)] : 0;
      std::fill(yacc.begin(), yacc.end(), 0.0);
      for (int j = 0; j < k_; ++j) {
        const int g = mk.topk[std::size_t(t * k_ + j)];
        const float wt = mk.weights[std::size_t(t * k_ + j)];
        const int64_t lr = local_row[std::size_t(t)];
        if (g < 0 || g >= E_) {  // an id past the experts: nothing, on every rank
          if (lr >= 0)
            for (int64_t c = 0; c < Wloc; ++c) kernels::store_elem(p[std::size_t(h1_)], dt, std::size_t((lr * k_ + j) * Wloc + c), 0.f);
          continue;
        }
        const float* w13 = W13[std::size_t(g)].data();
        const float* w2 = W2[std::size_t(g)].data();
        // w13 + its LoRA delta, per logical feature.
        const int nA = two ? 2 : 1;
        std::vector<float> u[2];
        for (int s = 0; s < nA && has_lora; ++s) {
          u[s].resize(std::size_t(ra));
          const int64_t eg = cfg_.shared ? 0 : g;
          const int Eag = cfg_.shared ? 1 : E_;
          for (int jj = 0; jj < ra; ++jj) {
            double acc = 0;
            for (int64_t h = 0; h < H_; ++h)
              acc += double(x[std::size_t(h)]) *
                     double(value(ka13[s], uint64_t(((int64_t(l) * Eag + eg) * r_ + jj) * H_ + h), s13));
            u[s][std::size_t(jj)] = round_to(dt, float(acc));
          }
        }
        auto h1_of = [&](int part, int64_t i) {
          const int64_t row = store_row(part, i);
          float v = round_to(dt, float(layers::dot(x.data(), w13 + row * H_, H_)));
          if (has_lora) {
            const int s = two ? part : 0;
            const int64_t brow = two ? i : row;
            const int64_t Nfull = two ? I_ : Wfull;
            double acc = 0;
            for (int jj = 0; jj < ra; ++jj)
              acc += double(u[s][std::size_t(jj)]) *
                     double(value(kb13[s], uint64_t(((int64_t(l) * E_ + g) * Nfull + brow) * r_ + jj), sb));
            v = round_to(dt, v + round_to(dt, float(acc)));
          }
          return v;
        };
        for (int64_t i = 0; i < I_; ++i) {
          gate[std::size_t(i)] = h1_of(0, i);
          if (gated) up[std::size_t(i)] = h1_of(1, i);
        }
        // intermediate_cache1 of this rank: its I columns of gate and of up (0 when the expert is elsewhere).
        if (lr >= 0) {
          const bool mine = on_rank(g);
          for (int64_t c = 0; c < Wloc; ++c) {
            float v = 0.f;
            if (mine) {
              if (!gated) v = gate[std::size_t(ibeg + c)];
              else if (layout_ == W13Layout::interleaved3d) v = (c % 2 ? up : gate)[std::size_t(ibeg + c / 2)];
              else v = c < Iloc ? gate[std::size_t(ibeg + c)] : up[std::size_t(ibeg + c - Iloc)];
            }
            kernels::store_elem(p[std::size_t(h1_)], dt, std::size_t((lr * k_ + j) * Wloc + c), v);
          }
        }
        for (int64_t i = 0; i < I_; ++i) {
          const float gv = gate[std::size_t(i)];
          const float sv = gv / (1.f + std::exp(-gv));
          act[std::size_t(i)] = round_to(dt, gated ? sv * up[std::size_t(i)] : sv);
        }
        std::vector<float> u2;
        if (has_lora) {
          u2.resize(std::size_t(ra));
          for (int jj = 0; jj < ra; ++jj) {
            double acc = 0;
            for (int64_t i = 0; i < I_; ++i)
              acc += double(act[std::size_t(i)]) * double(value(ka2, uint64_t(((int64_t(l) * E_ + g) * r_ + jj) * I_ + i), s2));
            u2[std::size_t(jj)] = round_to(dt, float(acc));
          }
        }
        for (int64_t h = 0; h < H_; ++h) {
          float v = round_to(dt, wt * round_to(dt, float(layers::dot(act.data(), w2 + h * I_, I_))));
          if (has_lora) {
            const int64_t eg = cfg_.shared ? 0 : g;
            const int Ebg = cfg_.shared ? 1 : E_;
            double acc = 0;
            for (int jj = 0; jj < ra; ++jj)
              acc += double(u2[std::size_t(jj)]) * double(value(kb2, uint64_t(((int64_t(l) * Ebg + eg) * H_ + h) * r_ + jj), sb));
            v = round_to(dt, v + round_to(dt, float(acc * wt)));
          }
          yacc[std::size_t(h)] += double(v);
        }
      }
      const int64_t yrow = subset_ ? t : local_row[std::size_t(t)];
      if (yrow >= 0)
        for (int64_t h = 0; h < H_; ++h)
          kernels::store_elem(p[std::size_t(y_)], dt, std::size_t(yrow * H_ + h), float(yacc[std::size_t(h)]));
    }
  });
}

}  // namespace

std::unique_ptr<Problem> make_moe_layer_problem(const Case& c, const BatchLayout& lay, const ProblemOptions& o, int rho) {
  return std::make_unique<MoeLayer>(c, lay, o, rho);
}

}  // namespace punica::bench
