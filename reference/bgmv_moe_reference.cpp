// Eigen CPU reference of bgmv_moe_gemm1_lora_delta / bgmv_moe_gemm2_lora_delta (SPEC §4.8.4-4.8.5)
// on host pointers. The pairs of one (adapter, expert) are gathered and each slice is two fp32 GEMMs
// over the adapter's TRUE rank (A rows / B columns past it are never read): U = X A^T rounded to
// lora_dtype, then U B^T; gemm2 weights each pair's row and sums it into its token's row.
#include <Eigen/Dense>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "kernels/common/error.h"
#include "reference/bgmv_moe_reference.h"

namespace punica::ref {

using kernels::DType;
using MatR = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

// rows x cols of a row-major matrix with row stride ld, in dtype dt, as float.
MatR load(const void* base, DType dt, int64_t rows, int64_t cols, int64_t ld) {
  MatR m(rows, cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) m(i, j) = kernels::load_elem(base, dt, std::size_t(i * ld + j));
  return m;
}
const void* entry(const int64_t* table, int idx, int64_t lora_elems, DType dt) {
  return reinterpret_cast<const char*>(table[idx]) + lora_elems * int64_t(kernels::dtype_size(dt));
}
int true_rank(const int32_t* ranks, int l, int rank) { return ranks ? std::clamp(ranks[l], 0, rank) : rank; }
void round_all(MatR& m, DType dt) {
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = kernels::round_to(dt, m.data()[i]);
}

}  // namespace

void bgmv_moe_gemm1_lora_delta(const kernels::BgmvMoeGemm1Args& a) {
  const std::string err = kernels::bgmv_moe_gemm1_arg_error(a);
  if (!err.empty()) throw Error(ErrorKind::usage, "bgmv_moe_gemm1_lora_delta: " + err);
  const int64_t P = a.num_tokens * a.top_k, H = a.hidden, W = 2 * a.intermediate;
  const int64_t ld = a.ld_out ? a.ld_out : W;
  const int S = a.shared_a ? 1 : 2;
  const int64_t N = a.shared_a ? W : a.intermediate;
  std::map<std::pair<int, int>, std::vector<int64_t>> groups;
  for (int64_t p = 0; p < P; ++p) {
    const int l = a.lora_ids[p / a.top_k], e = a.topk_ids[p];
    if (l >= 0 && l < a.max_loras && e >= 0 && e < a.num_experts) groups[{l, e}].push_back(p);
    else
      for (int64_t c = 0; c < W; ++c) kernels::store_elem(a.out, a.out_dtype, std::size_t(p * ld + c), 0.0f);
  }
  for (const auto& [le, pairs] : groups) {
    const int l = le.first, e = le.second, r = true_rank(a.lora_ranks, l, a.rank);
    const int64_t n = int64_t(pairs.size());
    MatR X(n, H);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h)
        X(i, h) = kernels::load_elem(a.x, a.lora_dtype, std::size_t((pairs[std::size_t(i)] / a.top_k) * H + h));
    for (int s = 0; s < S; ++s) {
      MatR Y = MatR::Zero(n, N);
      if (r > 0) {
        const MatR A = load(entry(a.w_ptr_a, s * a.num_experts + e, int64_t(l) * a.lora_stride_a, a.lora_dtype),
                            a.lora_dtype, r, H, H);
        const MatR B = load(entry(a.w_ptr_b, s * a.num_experts + e, int64_t(l) * a.lora_stride_b, a.lora_dtype),
                            a.lora_dtype, N, r, a.rank);
        MatR U = X * A.transpose();
        round_all(U, a.lora_dtype);
        Y = U * B.transpose();
      }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < N; ++c)
          kernels::store_elem(a.out, a.out_dtype, std::size_t(pairs[std::size_t(i)] * ld + s * N + c), a.scale * Y(i, c));
    }
  }
}

void bgmv_moe_gemm2_lora_delta(const kernels::BgmvMoeGemm2Args& a) {
  const std::string err = kernels::bgmv_moe_gemm2_arg_error(a);
  if (!err.empty()) throw Error(ErrorKind::usage, "bgmv_moe_gemm2_lora_delta: " + err);
  const int64_t P = a.num_tokens * a.top_k, H = a.hidden, I = a.intermediate;
  const int64_t ld = a.ld_out ? a.ld_out : H;
  std::map<std::pair<int, int>, std::vector<int64_t>> groups;
  for (int64_t p = 0; p < P; ++p) {
    const int l = a.lora_ids[p / a.top_k], e = a.topk_ids[p], q = a.perm[p];
    if (l >= 0 && l < a.max_loras && e >= 0 && e < a.num_experts && q >= 0) groups[{l, e}].push_back(p);
  }
  MatR acc = MatR::Zero(a.num_tokens, H);
  for (const auto& [le, pairs] : groups) {
    const int l = le.first, e = le.second, r = true_rank(a.lora_ranks, l, a.rank);
    if (r == 0) continue;
    const int64_t n = int64_t(pairs.size());
    MatR X(n, I);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = a.perm[pairs[std::size_t(i)]];
      if (row >= a.act_rows) throw Error(ErrorKind::usage, "bgmv_moe_gemm2_lora_delta: perm entry >= act_rows");
      for (int64_t c = 0; c < I; ++c) X(i, c) = kernels::load_elem(a.act, a.lora_dtype, std::size_t(row * I + c));
    }
    const MatR A = load(entry(a.w_ptr_a, e, int64_t(l) * a.lora_stride_a, a.lora_dtype), a.lora_dtype, r, I, I);
    const MatR B = load(entry(a.w_ptr_b, e, int64_t(l) * a.lora_stride_b, a.lora_dtype), a.lora_dtype, H, r, a.rank);
    MatR U = X * A.transpose();
    round_all(U, a.lora_dtype);
    const MatR Y = U * B.transpose();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = pairs[std::size_t(i)];
      acc.row(p / a.top_k) += a.topk_weights[p] * Y.row(i);
    }
  }
  for (int64_t t = 0; t < a.num_tokens; ++t)
    for (int64_t c = 0; c < H; ++c) kernels::store_elem(a.out, a.out_dtype, std::size_t(t * ld + c), a.scale * acc(t, c));
}

}  // namespace punica::ref
