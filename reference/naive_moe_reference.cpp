// Independent fp64 loops for the MoE LoRA ops (the check of moe_reference.cpp). Nothing is shared
// with that file except dtype.h's load/store/round and the kernel headers' size rules. Alignment:
// a scan over the experts per slot (pairs ascending inside a group). Fused op: pair by pair, slice
// by slice, element by element, with the GPU roundings (intermediate to intermediate_dtype, the
// weighted delta to the output dtype, then the add stored in the output dtype).
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "reference/moe_reference.h"

namespace punica::ref::naive {

using kernels::DType;
using kernels::FusedMoeLoraArgs;
using kernels::load_elem;
using kernels::round_to;
using kernels::store_elem;

namespace {

[[noreturn]] void bad(const char* op, const std::string& msg) {
  throw Error(ErrorKind::usage, std::string(op) + " (naive): " + msg);
}

bool slot_ok(int l, int L, const int32_t* enabled) { return l >= 0 && l < L && (!enabled || enabled[l] != 0); }

int expert_of(const kernels::MoeLoraAlignArgs& a, int64_t i) {
  const int g = a.topk_ids[i];
  if (g < 0 || g >= a.num_experts) return -1;
  return a.expert_map ? a.expert_map[g] : g;
}

// Calls f(pair, slot, expert) for every pair the routing visits (in its order, repeats included).
template <class F>
void for_each_visit(const FusedMoeLoraArgs& a, F&& f) {
  const int64_t numel = a.num_tokens * a.top_k;
  if (numel == 0) return;
  const auto& r = a.routing;
  if (r.naive) {
    for (int64_t i = 0; i < numel; ++i) {
      const int l = a.token_lora_mapping[i / a.top_k], e = r.expert_ids[i];
      if (slot_ok(l, a.max_loras, a.adapter_enabled) && e >= 0 && e < a.num_experts) f(i, l, e);
    }
    return;
  }
  const int64_t bs = r.block_size, P = r.max_padded, Q = (P + bs - 1) / bs;
  const int entries = r.lora_ids ? a.max_loras + 1 : a.max_loras;
  for (int n = 0; n < entries; ++n) {
    const int l = r.lora_ids ? r.lora_ids[n] : n;
    if (!slot_ok(l, a.max_loras, a.adapter_enabled)) continue;
    for (int64_t pos = 0; pos < P && pos < r.num_tokens_post_pad[l]; ++pos) {
      const int e = r.expert_ids[int64_t(l) * Q + pos / bs];
      const int32_t p = r.sorted_token_ids[int64_t(l) * P + pos];
      if (e >= 0 && e < a.num_experts && p >= 0 && p < numel) f(int64_t(p), l, e);
    }
  }
}

enum class Mode { fused, shrink, expand };

void fused_loops(const char* op, const FusedMoeLoraArgs& a, Mode mode) {
  if (a.dtype != DType::f16 && a.dtype != DType::bf16) bad(op, "dtype");
  if (a.num_tokens < 0 || a.top_k < 1 || a.num_slices < 1 || a.num_slices > kernels::kMaxSlices) bad(op, "sizes");
  const int rA = a.a_rank > 0 ? a.a_rank : a.max_rank, rB = a.max_rank;
  if (rB < 1 || rB > kernels::kMoeLoraMaxRank || rA > kernels::kMoeLoraMaxRank) bad(op, "rank");
  if (mode == Mode::fused && (rA != rB || a.a_rank_offset != 0)) bad(op, "sharded A in the one-call form");
  const int64_t numel = a.num_tokens * a.top_k, K = a.hidden, N = a.slice_width;
  const int64_t ldx = a.x_row_stride > 0 ? a.x_row_stride : K;
  const int64_t ldy = a.y_row_stride > 0 ? a.y_row_stride : a.offset + int64_t(a.num_slices) * N;
  const DType T = a.dtype, TI = a.inter_dtype();
  const int64_t Ea = a.shared_a ? 1 : a.num_experts, Eb = a.shared_b ? 1 : a.num_experts;
  if (mode == Mode::shrink)
    for (int64_t i = 0; i < int64_t(a.num_slices) * numel * rA; ++i) store_elem(a.intermediate, TI, size_t(i), 0.f);
  std::vector<double> u(size_t(std::max(rA, rB)));
  for_each_visit(a, [&](int64_t p, int l, int e) {
    const int rank = a.lora_ranks ? a.lora_ranks[l] : rB;
    if (rank < 0 || rank > rB) bad(op, "lora_ranks");
    const int64_t row = a.mul_routed_weight ? p : p / a.top_k;
    for (int s = 0; s < a.num_slices; ++s) {
      std::fill(u.begin(), u.end(), 0.0);
      if (mode != Mode::expand) {
        const int lo = a.a_rank_offset;
        for (int j = 0; j < rA; ++j) {
          if (j + lo >= rank) break;
          double acc = 0;
          const int64_t arow = ((int64_t(l) * Ea + (a.shared_a ? 0 : e)) * rA + j) * K;
          for (int64_t k = 0; k < K; ++k)
            acc += double(load_elem(a.x, T, size_t(row * ldx + k))) * double(load_elem(a.lora_a[s], T, size_t(arow + k)));
          u[size_t(j)] = round_to(TI, float(acc));
        }
        if (mode == Mode::shrink) {
          for (int j = 0; j < rA; ++j)
            store_elem(a.intermediate, TI, size_t((int64_t(s) * numel + p) * rA + j), float(u[size_t(j)]));
          continue;
        }
      } else {
        for (int j = 0; j < rank; ++j)
          u[size_t(j)] = load_elem(a.intermediate, TI, size_t((int64_t(s) * numel + p) * rB + j));
      }
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        const int64_t brow = ((int64_t(l) * Eb + (a.shared_b ? 0 : e)) * N + n) * rB;
        for (int j = 0; j < rank; ++j) acc += u[size_t(j)] * double(load_elem(a.lora_b[s], T, size_t(brow + j)));
        if (a.mul_routed_weight) acc *= double(a.topk_weights[p]);
        const size_t at = size_t(p * ldy + a.offset + int64_t(s) * N + n);
        const double prev = a.add_inputs ? double(load_elem(a.y, T, at)) : 0.0;
        store_elem(a.y, T, at, float(prev + double(round_to(T, float(acc)))));
      }
    }
  });
}

}  // namespace

void moe_lora_align(const kernels::MoeLoraAlignArgs& a) {
  const char* op = "moe_lora_align";
  if (a.num_tokens < 0 || a.top_k < 1 || a.max_loras < 0 || a.block_size < 1 || a.num_experts < 1) bad(op, "sizes");
  const int64_t numel = a.num_tokens * a.top_k;
  if (a.naive) {
    for (int64_t i = 0; i < numel; ++i) a.expert_ids[i] = expert_of(a, i);
    return;
  }
  const int64_t bs = a.block_size;
  const int64_t P = a.max_padded > 0 ? a.max_padded
                                     : kernels::moe_lora_align_sizes(numel, a.num_experts, a.block_size,
                                                                     a.pad_sorted_ids).max_padded;
  const int64_t Q = (P + bs - 1) / bs;
  if (P == 0) return;
  const int entries = a.lora_ids ? a.max_loras + 1 : a.max_loras;
  std::vector<int> seen;
  for (int n = 0; n < entries; ++n) {
    const int l = a.lora_ids ? a.lora_ids[n] : n;
    if (!slot_ok(l, a.max_loras, a.adapter_enabled)) continue;
    if (std::find(seen.begin(), seen.end(), l) != seen.end()) continue;
    seen.push_back(l);
    int32_t* sorted = a.sorted_token_ids + int64_t(l) * P;
    int32_t* eids = a.expert_ids + int64_t(l) * Q;
    for (int64_t q = 0; q < P; ++q) sorted[q] = int32_t(numel);
    for (int64_t b = 0; b < Q; ++b) eids[b] = -1;
    int64_t pos = 0;
    for (int e = 0; e < a.num_experts; ++e) {
      const int64_t start = pos;
      for (int64_t i = 0; i < numel; ++i)
        if (a.token_lora_mapping[i / a.top_k] == l && expert_of(a, i) == e) {
          if (pos < P) sorted[pos] = int32_t(i);
          ++pos;
        }
      while ((pos - start) % bs) ++pos;
      for (int64_t b = start / bs; b < pos / bs && b < Q; ++b) eids[b] = e;
    }
    a.num_tokens_post_pad[l] = int32_t(pos);
  }
}

void add_lora_fused_moe(const FusedMoeLoraArgs& a) { fused_loops("add_lora_fused_moe", a, Mode::fused); }
void fused_moe_lora_shrink(const FusedMoeLoraArgs& a) { fused_loops("fused_moe_lora_shrink", a, Mode::shrink); }
void fused_moe_lora_expand(const FusedMoeLoraArgs& a) { fused_loops("fused_moe_lora_expand", a, Mode::expand); }

kernels::MoeLoraRouting add_lora_w13(const kernels::AddLoraW13Args& a) {
  // vLLM's rule (SPARSITY_FACTOR = 8) restated here, so a wrong moe_lora_use_naive shows.
  const FusedMoeLoraArgs& o = a.op;
  const bool naive_path = a.expert_map == nullptr && o.num_tokens * o.top_k * 8 <= int64_t(o.num_experts) * o.max_loras;
  const kernels::MoeLoraRouting r = kernels::moe_lora_w13_routing(a);
  if (r.naive != naive_path) bad("add_lora_w13", "the path rule disagrees with vLLM's");
  if (!naive_path) moe_lora_align(kernels::moe_lora_w13_align_args(a));
  FusedMoeLoraArgs w13 = o;
  w13.mul_routed_weight = false;
  w13.routing = r;
  add_lora_fused_moe(w13);
  return r;
}

void add_lora_w2(const FusedMoeLoraArgs& a) {
  FusedMoeLoraArgs w2 = a;
  w2.mul_routed_weight = true;
  add_lora_fused_moe(w2);
}

}  // namespace punica::ref::naive
