// Eigen CPU reference of the MoE LoRA ops (SPEC §4.2-4.6, A.5-A.6) on host pointers.
//
// Alignment: counts per (slot, local expert), padded prefix sums, groups written in ascending pair
// order (the GPU order inside a group differs; check_moe_lora_align compares groups as sets).
// Fused op: the visited pairs come from the routing exactly as the kernel reads it (aligned: the
// slot's blocks below num_tokens_post_pad with a valid expert; naive: one pair per block); pairs of
// one (slot, expert) are gathered and each slice is two fp32 GEMMs over the slot's TRUE rank
// (padding rows of A / columns of B are never read), U rounded to intermediate_dtype.
#include <Eigen/Dense>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/error.h"
#include "reference/moe_reference.h"

namespace punica::ref {

using kernels::DType;
using kernels::FusedMoeLoraArgs;
using kernels::MoeLoraAlignArgs;
using MatR = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

[[noreturn]] void usage(const char* op, const std::string& msg) {
  throw Error(ErrorKind::usage, std::string(op) + ": " + msg);
}

void check_align_args(const char* op, const MoeLoraAlignArgs& a) {
  if (a.num_tokens < 0 || a.top_k < 1 || a.max_loras < 0) usage(op, "bad sizes");
  if (a.num_experts < 1 || a.num_experts > kernels::kMoeAlignMaxExperts) usage(op, "num_experts out of range");
  if (a.block_size < 1) usage(op, "block_size < 1");
  for (int64_t m = 0; m < a.num_tokens; ++m)
    if (a.token_lora_mapping[m] < -1) usage(op, "mapping value < -1");
}

int local_expert(const MoeLoraAlignArgs& a, int64_t i) {
  const int g = a.topk_ids[i];
  if (g < 0 || g >= a.num_experts) return -1;
  return a.expert_map ? a.expert_map[g] : g;
}

// Distinct slots the alignment processes (valid, enabled), in lora_ids order.
std::vector<int> processed_slots(const MoeLoraAlignArgs& a) {
  std::vector<int> out;
  const int entries = a.lora_ids ? a.max_loras + 1 : a.max_loras;
  for (int n = 0; n < entries; ++n) {
    const int l = a.lora_ids ? a.lora_ids[n] : n;
    if (l < 0 || l >= a.max_loras) continue;
    if (a.adapter_enabled && a.adapter_enabled[l] == 0) continue;
    if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
  }
  return out;
}

int64_t padded_of(const MoeLoraAlignArgs& a) {
  return a.max_padded > 0 ? a.max_padded
                          : kernels::moe_lora_align_sizes(a.num_tokens * a.top_k, a.num_experts, a.block_size,
                                                          a.pad_sorted_ids).max_padded;
}

// ---- the fused op ----
struct Visit {
  int64_t pair;
  int l, e;
};

// The pairs the kernel visits, from the routing (see the file comment).
std::vector<Visit> visits(const FusedMoeLoraArgs& a) {
  std::vector<Visit> v;
  const int64_t numel = a.num_tokens * a.top_k;
  const auto& r = a.routing;
  auto ok_slot = [&](int l) { return l >= 0 && l < a.max_loras && (!a.adapter_enabled || a.adapter_enabled[l] != 0); };
  if (numel == 0) return v;
  if (r.naive) {
    for (int64_t i = 0; i < numel; ++i) {
      const int l = a.token_lora_mapping[i / a.top_k];
      const int e = r.expert_ids[i];
      if (ok_slot(l) && e >= 0 && e < a.num_experts) v.push_back({i, l, e});
    }
    return v;
  }
  const int bs = r.block_size;
  const int64_t P = r.max_padded, Q = (P + bs - 1) / bs;
  const int entries = r.lora_ids ? a.max_loras + 1 : a.max_loras;
  for (int n = 0; n < entries; ++n) {
    const int l = r.lora_ids ? r.lora_ids[n] : n;
    if (!ok_slot(l)) continue;
    for (int64_t b = 0; b < Q && b * bs < r.num_tokens_post_pad[l]; ++b) {
      const int e = r.expert_ids[int64_t(l) * Q + b];
      if (e < 0 || e >= a.num_experts) continue;
      for (int q = 0; q < bs && b * bs + q < P; ++q) {
        const int32_t p = r.sorted_token_ids[int64_t(l) * P + b * bs + q];
        if (p >= 0 && p < numel) v.push_back({p, l, e});
      }
    }
  }
  return v;
}

enum class Mode { fused, shrink, expand };

void validate(const char* op, const FusedMoeLoraArgs& a, Mode mode) {
  if (a.dtype != DType::f16 && a.dtype != DType::bf16) usage(op, "dtype must be fp16 or bf16");
  if (a.num_tokens < 0 || a.top_k < 1 || a.max_loras < 0 || a.num_experts < 0 || a.hidden < 0 ||
      a.slice_width < 0 || a.offset < 0)
    usage(op, "bad sizes");
  if (a.num_slices < 1 || a.num_slices > kernels::kMaxSlices) usage(op, "num_slices out of range");
  const int rA = a.a_rank > 0 ? a.a_rank : a.max_rank;
  if (a.max_rank < 1 || a.max_rank > kernels::kMoeLoraMaxRank || rA > kernels::kMoeLoraMaxRank)
    usage(op, "rank out of range");
  if (mode == Mode::fused && (rA != a.max_rank || a.a_rank_offset != 0)) usage(op, "one-call form with a sharded A");
  if (a.lora_ranks)
    for (int l = 0; l < a.max_loras; ++l)
      if (a.lora_ranks[l] < 0 || a.lora_ranks[l] > a.max_rank) usage(op, "lora_ranks out of [0, max_rank]");
  for (int64_t m = 0; m < a.num_tokens; ++m)
    if (a.token_lora_mapping[m] < -1) usage(op, "mapping value < -1");
  if (a.mul_routed_weight && mode != Mode::shrink && !a.topk_weights) usage(op, "no topk_weights");
}

int64_t ldy_of(const FusedMoeLoraArgs& a) {
  return a.y_row_stride > 0 ? a.y_row_stride : a.offset + int64_t(a.num_slices) * a.slice_width;
}

void load_row(const void* base, DType t, int64_t off, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = kernels::load_elem(base, t, size_t(off + i));
}

void fused_core(const char* op, const FusedMoeLoraArgs& a, Mode mode) {
  validate(op, a, mode);
  const int64_t numel = a.num_tokens * a.top_k;
  const int rA = a.a_rank > 0 ? a.a_rank : a.max_rank, rB = a.max_rank;
  const int64_t K = a.hidden, N = a.slice_width, S = a.num_slices;
  const int64_t ldx = a.x_row_stride > 0 ? a.x_row_stride : K, ldy = ldy_of(a);
  const DType T = a.dtype, TI = a.inter_dtype();
  if (mode == Mode::shrink)
    for (int64_t i = 0; i < S * numel * rA; ++i) kernels::store_elem(a.intermediate, TI, size_t(i), 0.f);
  // Group the visits by (slot, expert), keeping each pair's visit count (a pair listed twice adds twice).
  std::map<std::pair<int, int>, std::vector<int64_t>> groups;
  for (const Visit& v : visits(a)) groups[{v.l, v.e}].push_back(v.pair);
  const int64_t Ea = a.shared_a ? 1 : a.num_experts, Eb = a.shared_b ? 1 : a.num_experts;
  for (const auto& [le, pairs] : groups) {
    const int l = le.first, e = le.second;
    const int rank = a.lora_ranks ? a.lora_ranks[l] : rB;
    const int rl_loc = std::max(0, std::min(rank - a.a_rank_offset, rA));
    const int64_t n = int64_t(pairs.size());
    for (int64_t s = 0; s < S; ++s) {
      MatR U = MatR::Zero(n, mode == Mode::shrink ? rA : rank);
      if (mode != Mode::expand) {
        MatR X(n, K), A(rl_loc, K);
        for (int64_t q = 0; q < n; ++q) {
          const int64_t row = a.mul_routed_weight ? pairs[size_t(q)] : pairs[size_t(q)] / a.top_k;
          load_row(a.x, T, row * ldx, K, X.row(q).data());
        }
        const int64_t abase = ((int64_t(l) * Ea + (a.shared_a ? 0 : e)) * rA) * K;
        for (int j = 0; j < rl_loc; ++j) load_row(a.lora_a[s], T, abase + j * K, K, A.row(j).data());
        MatR u = X * A.transpose();
        for (int64_t q = 0; q < n; ++q)
          for (int j = 0; j < rl_loc; ++j) U(q, j) = kernels::round_to(TI, u(q, j));
        if (mode == Mode::shrink) {
          for (int64_t q = 0; q < n; ++q)
            for (int j = 0; j < rA; ++j)
              kernels::store_elem(a.intermediate, TI, size_t((s * numel + pairs[size_t(q)]) * rA + j), U(q, j));
          continue;
        }
      } else {
        for (int64_t q = 0; q < n; ++q)
          for (int j = 0; j < rank; ++j)
            U(q, j) = kernels::load_elem(a.intermediate, TI, size_t((s * numel + pairs[size_t(q)]) * rB + j));
      }
      MatR B(N, rank);
      const int64_t bbase = (int64_t(l) * Eb + (a.shared_b ? 0 : e)) * N * rB;
      for (int64_t c = 0; c < N; ++c) load_row(a.lora_b[s], T, bbase + c * rB, rank, B.row(c).data());
      MatR D = U.leftCols(rank) * B.transpose();
      for (int64_t q = 0; q < n; ++q) {
        const int64_t p = pairs[size_t(q)];
        const float w = a.mul_routed_weight ? a.topk_weights[p] : 1.f;
        for (int64_t c = 0; c < N; ++c) {
          float d = D(q, c);
          if (a.mul_routed_weight) d *= w;
          const size_t at = size_t(p * ldy + a.offset + s * N + c);
          const float prev = a.add_inputs ? kernels::load_elem(a.y, T, at) : 0.f;
          kernels::store_elem(a.y, T, at, prev + kernels::round_to(T, d));
        }
      }
    }
  }
}

}  // namespace

void moe_lora_align(const MoeLoraAlignArgs& a) {
  const char* op = "moe_lora_align";
  check_align_args(op, a);
  const int64_t numel = a.num_tokens * a.top_k;
  if (a.naive) {
    for (int64_t i = 0; i < numel; ++i) a.expert_ids[i] = local_expert(a, i);
    return;
  }
  const int64_t P = padded_of(a), bs = a.block_size, Q = (P + bs - 1) / bs;
  if (P == 0) return;
  const int E = a.num_experts;
  for (int l : processed_slots(a)) {
    std::vector<std::vector<int32_t>> group(static_cast<size_t>(E));
    for (int64_t i = 0; i < numel; ++i) {
      if (a.token_lora_mapping[i / a.top_k] != l) continue;
      const int e = local_expert(a, i);
      if (e >= 0 && e < E) group[size_t(e)].push_back(int32_t(i));
    }
    int32_t* sorted = a.sorted_token_ids + int64_t(l) * P;
    int32_t* eids = a.expert_ids + int64_t(l) * Q;
    std::fill(sorted, sorted + P, int32_t(numel));
    std::fill(eids, eids + Q, -1);
    int64_t cs = 0;
    for (int e = 0; e < E; ++e) {
      const int64_t c = int64_t(group[size_t(e)].size());
      const int64_t pad = (c + bs - 1) / bs * bs;
      for (int64_t q = 0; q < c && cs + q < P; ++q) sorted[cs + q] = group[size_t(e)][size_t(q)];
      for (int64_t b = cs / bs; b < (cs + pad) / bs && b < Q; ++b) eids[b] = e;
      cs += pad;
    }
    a.num_tokens_post_pad[l] = int32_t(cs);
  }
}

void add_lora_fused_moe(const FusedMoeLoraArgs& a) { fused_core("add_lora_fused_moe", a, Mode::fused); }
void fused_moe_lora_shrink(const FusedMoeLoraArgs& a) { fused_core("fused_moe_lora_shrink", a, Mode::shrink); }
void fused_moe_lora_expand(const FusedMoeLoraArgs& a) { fused_core("fused_moe_lora_expand", a, Mode::expand); }

kernels::MoeLoraRouting add_lora_w13(const kernels::AddLoraW13Args& a) {
  FusedMoeLoraArgs op = a.op;
  op.mul_routed_weight = false;
  op.routing = kernels::moe_lora_w13_routing(a);
  if (!op.routing.naive) moe_lora_align(kernels::moe_lora_w13_align_args(a));
  add_lora_fused_moe(op);
  return op.routing;
}

void add_lora_w2(const FusedMoeLoraArgs& a) {
  FusedMoeLoraArgs op = a;
  op.mul_routed_weight = true;
  add_lora_fused_moe(op);
}

std::string check_moe_lora_align(const MoeLoraAlignArgs& a, const int32_t* got_sorted, const int32_t* got_eids,
                                 const int32_t* got_ntpp, const int32_t* before_sorted,
                                 const int32_t* before_eids, const int32_t* before_ntpp) {
  const int64_t numel = a.num_tokens * a.top_k;
  const int E = a.num_experts;
  if (a.naive) {
    for (int64_t i = 0; i < numel; ++i)
      if (got_eids[i] != local_expert(a, i))
        return "naive expert_ids[" + std::to_string(i) + "] = " + std::to_string(got_eids[i]);
    return "";
  }
  const int64_t P = padded_of(a), bs = a.block_size, Q = (P + bs - 1) / bs;
  if (P == 0) {  // an empty batch (numel = 0): nothing is written
    for (int l = 0; l < a.max_loras; ++l)
      if (got_ntpp[l] != before_ntpp[l]) return "empty batch changed num_tokens_post_pad";
    return "";
  }
  const std::vector<int> done = processed_slots(a);
  for (int l = 0; l < a.max_loras; ++l) {
    const std::string at = "slot " + std::to_string(l) + ": ";
    const int32_t* s = got_sorted + int64_t(l) * P;
    const int32_t* eb = got_eids + int64_t(l) * Q;
    if (std::find(done.begin(), done.end(), l) == done.end()) {
      if (got_ntpp[l] != before_ntpp[l]) return at + "unprocessed slot's num_tokens_post_pad changed";
      for (int64_t q = 0; q < P; ++q)
        if (s[q] != before_sorted[int64_t(l) * P + q]) return at + "unprocessed slot's sorted_token_ids changed";
      for (int64_t b = 0; b < Q; ++b)
        if (eb[b] != before_eids[int64_t(l) * Q + b]) return at + "unprocessed slot's expert_ids changed";
      continue;
    }
    std::vector<std::vector<int32_t>> want(static_cast<size_t>(E));
    for (int64_t i = 0; i < numel; ++i) {
      if (a.token_lora_mapping[i / a.top_k] != l) continue;
      const int e = local_expert(a, i);
      if (e >= 0 && e < E) want[size_t(e)].push_back(int32_t(i));
    }
    int64_t cs = 0;
    for (int e = 0; e < E; ++e) {
      const int64_t c = int64_t(want[size_t(e)].size()), pad = (c + bs - 1) / bs * bs;
      if (cs + pad > P) return at + "groups exceed P";
      std::vector<int32_t> got(s + cs, s + cs + c);
      std::sort(got.begin(), got.end());
      if (got != want[size_t(e)]) return at + "group of expert " + std::to_string(e) + " holds other pairs";
      for (int64_t q = cs + c; q < cs + pad; ++q)
        if (s[q] != numel) return at + "padding of expert " + std::to_string(e) + " is not the sentinel";
      for (int64_t b = cs / bs; b < (cs + pad) / bs; ++b)
        if (eb[b] != e) return at + "expert_ids[" + std::to_string(b) + "] = " + std::to_string(eb[b]) + " != " + std::to_string(e);
      cs += pad;
    }
    if (got_ntpp[l] != cs) return at + "num_tokens_post_pad " + std::to_string(got_ntpp[l]) + " != " + std::to_string(cs);
    for (int64_t q = cs; q < P; ++q)
      if (s[q] != numel) return at + "tail of sorted_token_ids is not the sentinel";
    for (int64_t b = cs / bs; b < Q; ++b)
      if (eb[b] != -1) return at + "expert_ids past the end is not -1";
  }
  return "";
}

}  // namespace punica::ref
