// Independent fp64 loops for bgmv_moe_gemm1_lora_delta / bgmv_moe_gemm2_lora_delta (the check of
// bgmv_moe_reference.cpp): pair by pair, element by element, with the kernels' roundings (the
// rank-r intermediate to lora_dtype, the scaled sum to out_dtype). Shares only dtype.h and the
// kernel header's argument checks with that file.
#include <algorithm>
#include <vector>

#include "kernels/common/error.h"
#include "reference/bgmv_moe_reference.h"

namespace punica::ref::naive {

using kernels::load_elem;
using kernels::round_to;
using kernels::store_elem;

namespace {
// Element (row, col) of adapter l's matrix behind table entry idx (row stride ld).
double weight(const int64_t* table, int idx, int64_t stride, int l, kernels::DType dt, int64_t row, int64_t col,
              int64_t ld) {
  const char* base = reinterpret_cast<const char*>(table[idx]);
  const std::size_t i = std::size_t(int64_t(l) * stride + row * ld + col);
  return load_elem(base, dt, i);
}
}  // namespace

void bgmv_moe_gemm1_lora_delta(const kernels::BgmvMoeGemm1Args& a) {
  const std::string err = kernels::bgmv_moe_gemm1_arg_error(a);
  if (!err.empty()) throw Error(ErrorKind::usage, "bgmv_moe_gemm1_lora_delta (naive): " + err);
  const int64_t I = a.intermediate, W = 2 * I, ld = a.ld_out ? a.ld_out : W, H = a.hidden;
  for (int64_t p = 0; p < a.num_tokens * a.top_k; ++p) {
    const int64_t t = p / a.top_k;
    const int l = a.lora_ids[t], e = a.topk_ids[p];
    const bool live = l >= 0 && l < a.max_loras && e >= 0 && e < a.num_experts;
    const int r = !live ? 0 : a.lora_ranks ? std::min(std::max(a.lora_ranks[l], 0), a.rank) : a.rank;
    for (int64_t c = 0; c < W; ++c) {
      // column c: regular mode slice c / I (gate, up) row c % I; shared-A one slice of 2I rows
      const int s = a.shared_a ? 0 : int(c / I);
      const int64_t n = a.shared_a ? c : c % I;
      double y = 0;
      for (int j = 0; j < r; ++j) {
        double u = 0;
        for (int64_t h = 0; h < H; ++h)
          u += double(load_elem(a.x, a.lora_dtype, std::size_t(t * H + h))) *
               weight(a.w_ptr_a, s * a.num_experts + e, a.lora_stride_a, l, a.lora_dtype, j, h, H);
        y += double(round_to(a.lora_dtype, float(u))) *
             weight(a.w_ptr_b, s * a.num_experts + e, a.lora_stride_b, l, a.lora_dtype, n, j, a.rank);
      }
      store_elem(a.out, a.out_dtype, std::size_t(p * ld + c), live ? float(double(a.scale) * y) : 0.0f);
    }
  }
}

void bgmv_moe_gemm2_lora_delta(const kernels::BgmvMoeGemm2Args& a) {
  const std::string err = kernels::bgmv_moe_gemm2_arg_error(a);
  if (!err.empty()) throw Error(ErrorKind::usage, "bgmv_moe_gemm2_lora_delta (naive): " + err);
  const int64_t H = a.hidden, I = a.intermediate, ld = a.ld_out ? a.ld_out : H;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    std::vector<double> y(std::size_t(H), 0.0);
    const int l = a.lora_ids[t];
    for (int j = 0; j < a.top_k && l >= 0 && l < a.max_loras; ++j) {
      const int64_t p = t * a.top_k + j;
      const int e = a.topk_ids[p];
      const int64_t row = a.perm[p];
      if (e < 0 || e >= a.num_experts || row < 0) continue;
      if (row >= a.act_rows) throw Error(ErrorKind::usage, "bgmv_moe_gemm2_lora_delta (naive): perm entry >= act_rows");
      const int r = a.lora_ranks ? std::min(std::max(a.lora_ranks[l], 0), a.rank) : a.rank;
      std::vector<double> u(static_cast<std::size_t>(r), 0.0);
      for (int q = 0; q < r; ++q) {
        double s = 0;
        for (int64_t c = 0; c < I; ++c)
          s += double(load_elem(a.act, a.lora_dtype, std::size_t(row * I + c))) *
               weight(a.w_ptr_a, e, a.lora_stride_a, l, a.lora_dtype, q, c, I);
        u[std::size_t(q)] = round_to(a.lora_dtype, float(s));
      }
      for (int64_t n = 0; n < H; ++n) {
        double d = 0;
        for (int q = 0; q < r; ++q) d += u[std::size_t(q)] * weight(a.w_ptr_b, e, a.lora_stride_b, l, a.lora_dtype, n, q, a.rank);
        y[std::size_t(n)] += double(a.topk_weights[p]) * d;
      }
    }
    for (int64_t n = 0; n < H; ++n) store_elem(a.out, a.out_dtype, std::size_t(t * ld + n), float(double(a.scale) * y[std::size_t(n)]));
  }
}

}  // namespace punica::ref::naive
