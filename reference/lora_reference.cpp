// Eigen CPU reference of the dense LoRA op contracts (GPU semantics, SPEC "chosen semantics").
//
// Host pointers only. Tokens are grouped by slot and each (slot, slice) is one fp32 GEMM over the
// slot's TRUE rank r_l = lora_ranks[l]: padding rows of A / columns of B / entries of the expand
// input beyond r_l are never read (a NaN-filled padding cannot leak in).
//
// Only meta.token_lora_mapping is read. meta.no_lora_flag and the other LoRAKernelMeta fields are
// ignored on purpose: the result is computed from the mapping alone, so a batch whose tokens are
// all -1 gives exactly what the no-LoRA early exit of the GPU op gives (shrink: all zeros, since
// it overwrites y; expand and the composites: y unchanged), and a stale flag cannot mask a bug.
//
// lora_ranks may be null: every slot then has rank max_rank.
#include <Eigen/Dense>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "reference/lora_reference.h"

namespace punica::ref {

using kernels::DType;
using MatR = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

void usage(const std::string& op, const std::string& msg) {
  throw Error(ErrorKind::usage, op + ": " + msg);
}

// Convert `n` elements of a 16/32-bit buffer starting at element `off` to float (switch hoisted).
inline void load_row(const void* base, DType t, std::size_t off, int64_t n, float* dst,
                     bool round_w = false, DType w = DType::f32) {
  switch (t) {
    case DType::f32: {
      const float* p = static_cast<const float*>(base) + off;
      std::memcpy(dst, p, size_t(n) * sizeof(float));
      break;
    }
    case DType::f16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = kernels::f16_bits_to_f32(p[i]);
      break;
    }
    case DType::bf16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = kernels::bf16_bits_to_f32(p[i]);
      break;
    }
  }
  if (round_w && w != DType::f32 && w != t)
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::round_to(w, dst[i]);
}

// A `rows x cols` block with row stride `ld` (elements) from offset `off`, as a float matrix.
MatR load_block(const void* base, DType t, std::size_t off, int64_t rows, int64_t cols, int64_t ld) {
  MatR m(rows, cols);
  for (int64_t i = 0; i < rows; ++i) load_row(base, t, off + size_t(i * ld), cols, m.row(i).data());
  return m;
}

struct Mapping {
  std::vector<std::vector<int64_t>> tokens;  // per slot, ascending token ids
  std::vector<int> rank;                     // per slot true rank
};

// Validates the mapping and ranks and groups tokens by slot.
Mapping group_tokens(const char* op, const int32_t* map, int64_t T, int L, int max_rank,
                     const int32_t* ranks) {
  if (T < 0) usage(op, "negative number of tokens/rows");
  if (L < 0) usage(op, "negative max_loras");
  if (max_rank < 0) usage(op, "negative max_rank");
  if (T > 0 && !map) usage(op, "meta.token_lora_mapping is null");
  Mapping m;
  m.tokens.resize(size_t(L));
  m.rank.assign(size_t(L), max_rank);
  if (ranks)
    for (int l = 0; l < L; ++l) {
      if (ranks[l] < 0 || ranks[l] > max_rank)
        usage(op, "lora_ranks[" + std::to_string(l) + "] = " + std::to_string(ranks[l]) +
                      " outside [0, max_rank=" + std::to_string(max_rank) + "]");
      m.rank[size_t(l)] = ranks[l];
    }
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = map[t];
    if (s < -1 || s >= L)
      usage(op, "mapping value " + std::to_string(s) + " at row " + std::to_string(t) +
                    " outside [-1, max_loras=" + std::to_string(L) + ")");
    if (s >= 0) m.tokens[size_t(s)].push_back(t);
  }
  return m;
}

void check_slices(const char* op, int S) {
  if (S < 1 || S > kernels::kMaxSlices)
    usage(op, "num_slices " + std::to_string(S) + " outside [1, " +
                  std::to_string(kernels::kMaxSlices) + "]");
}

// ---- shared cores (fp32) ----

struct ShrinkCore {
  DType dtype;
  int64_t T, K;
  const void* x;
  int64_t x_stride;
  int S;
  const void* const* lora_a;  // [S] each [L, max_rank, K]
  int max_rank;
  float scale;
  void* y;  // [S, T, max_rank] in out_dtype
  DType out_dtype;
};

void run_shrink(const char* op, const ShrinkCore& c, const Mapping& m) {
  if (c.K < 0) usage(op, "negative hidden size");
  if (c.T == 0) return;
  if (!c.x || !c.y) usage(op, "x or y is null");
  if (c.x_stride < c.K) usage(op, "x_row_stride smaller than hidden");
  for (int s = 0; s < c.S; ++s)
    if (!c.lora_a[s]) usage(op, "lora_a[" + std::to_string(s) + "] is null");
  const std::size_t r = size_t(c.max_rank);
  // Overwrite the whole output: +0.0 is all-zero bits in every dtype.
  std::memset(c.y, 0, size_t(c.S) * size_t(c.T) * r * kernels::dtype_size(c.out_dtype));
  for (std::size_t l = 0; l < m.tokens.size(); ++l) {
    const auto& toks = m.tokens[l];
    const int rl = m.rank[l];
    if (toks.empty() || rl == 0) continue;
    MatR X(int64_t(toks.size()), c.K);
    for (std::size_t i = 0; i < toks.size(); ++i)
      load_row(c.x, c.dtype, size_t(toks[i] * c.x_stride), c.K, X.row(int64_t(i)).data());
    for (int s = 0; s < c.S; ++s) {
      const MatR A = load_block(c.lora_a[s], c.dtype, l * r * size_t(c.K), rl, c.K, c.K);
      const MatR Y = (X * A.transpose()) * c.scale;
      for (std::size_t i = 0; i < toks.size(); ++i) {
        const std::size_t base = (size_t(s) * size_t(c.T) + size_t(toks[i])) * r;
        for (int j = 0; j < rl; ++j)
          kernels::store_elem(c.y, c.out_dtype, base + size_t(j), Y(int64_t(i), j));
      }
    }
  }
}

struct ExpandCore {
  DType in_dtype, dtype;
  int64_t T;
  const void* x;  // [S, T, max_rank] in in_dtype
  int S;
  const void* const* lora_b;  // [S] each [L, N_s, max_rank]
  const int64_t* width;       // [S]
  int max_rank;
  void* y;
  int64_t y_stride, offset;
  bool add_inputs;
  bool round_input;  // round x to dtype before the product (GPU: always)
};

void run_expand(const char* op, const ExpandCore& c, const Mapping& m) {
  if (c.offset < 0) usage(op, "negative offset_start");
  int64_t total = c.offset;
  for (int s = 0; s < c.S; ++s) {
    if (c.width[s] < 0) usage(op, "negative slice width");
    total += c.width[s];
  }
  if (c.T == 0) return;
  if (!c.x || !c.y) usage(op, "x or y is null");
  if (c.y_stride < total)
    usage(op, "y_row_stride " + std::to_string(c.y_stride) + " smaller than offset + sum N_s = " +
                  std::to_string(total));
  for (int s = 0; s < c.S; ++s)
    if (!c.lora_b[s]) usage(op, "lora_b[" + std::to_string(s) + "] is null");
  const std::size_t r = size_t(c.max_rank);
  int64_t col = c.offset;
  for (int s = 0; s < c.S; ++s) {
    const int64_t N = c.width[s];
    for (std::size_t l = 0; l < m.tokens.size() && N > 0; ++l) {
      const auto& toks = m.tokens[l];
      if (toks.empty()) continue;
      const int rl = m.rank[l];
      const int64_t n_tok = int64_t(toks.size());
      MatR V(n_tok, N);
      if (rl == 0) {
        V.setZero();
      } else {
        MatR U(n_tok, rl);
        for (int64_t i = 0; i < n_tok; ++i)
          load_row(c.x, c.in_dtype, (size_t(s) * size_t(c.T) + size_t(toks[size_t(i)])) * r, rl,
                   U.row(i).data(), c.round_input, c.dtype);
        const MatR B = load_block(c.lora_b[s], c.dtype, l * size_t(N) * r, N, rl, c.max_rank);
        V.noalias() = U * B.transpose();
      }
      for (int64_t i = 0; i < n_tok; ++i) {
        const std::size_t row = size_t(toks[size_t(i)] * c.y_stride + col);
        for (int64_t n = 0; n < N; ++n) {
          const float v = kernels::round_to(c.dtype, V(i, n));
          const float base = c.add_inputs ? kernels::load_elem(c.y, c.dtype, row + size_t(n)) : 0.0f;
          kernels::store_elem(c.y, c.dtype, row + size_t(n), base + v);
        }
      }
    }
    col += N;
  }
}

// shrink into a local fp32 buffer, optional rounding of the intermediate, expand with offset 0.
void linear_core(const char* op, DType dtype, int64_t T, int64_t K, const void* x,
                 int64_t x_stride, int S, const void* const* A, const void* const* B,
                 const int64_t* widths, int max_rank, const Mapping& m, float scale, void* y,
                 int64_t y_stride, bool add_inputs, const RefOptions& o) {
  std::vector<float> buf(size_t(S) * size_t(T) * size_t(max_rank));
  run_shrink(op, ShrinkCore{dtype, T, K, x, x_stride, S, A, max_rank, scale, buf.data(), DType::f32},
             m);
  if (o.round_intermediate)
    for (float& v : buf) v = kernels::round_to(dtype, v);
  run_expand(op, ExpandCore{DType::f32, dtype, T, buf.data(), S, B, widths, max_rank, y, y_stride,
                            0, add_inputs, o.round_intermediate},
             m);
}

}  // namespace

void lora_shrink(const kernels::LoraShrinkArgs& a) {
  const char* op = "lora_shrink";
  check_slices(op, a.num_slices);
  const Mapping m =
      group_tokens(op, a.meta.token_lora_mapping, a.num_tokens, a.max_loras, a.max_rank, a.lora_ranks);
  run_shrink(op, ShrinkCore{a.dtype, a.num_tokens, a.hidden, a.x, a.x_row_stride, a.num_slices,
                            a.lora_a, a.max_rank, a.scale, a.y, a.out_dtype},
             m);
}

void lora_expand(const kernels::LoraExpandArgs& a) {
  const char* op = "lora_expand";
  check_slices(op, a.num_slices);
  const Mapping m =
      group_tokens(op, a.meta.token_lora_mapping, a.num_tokens, a.max_loras, a.max_rank, a.lora_ranks);
  run_expand(op, ExpandCore{a.in_dtype, a.dtype, a.num_tokens, a.x, a.num_slices, a.lora_b,
                            a.slice_width, a.max_rank, a.y, a.y_row_stride, a.offset_start,
                            a.add_inputs, true},
             m);
}

void add_lora_linear(const kernels::AddLoraLinearArgs& a, const RefOptions& o) {
  const char* op = "add_lora_linear";
  check_slices(op, a.num_slices);
  const Mapping m =
      group_tokens(op, a.meta.token_lora_mapping, a.num_tokens, a.max_loras, a.max_rank, a.lora_ranks);
  linear_core(op, a.dtype, a.num_tokens, a.hidden, a.x, a.x_row_stride, a.num_slices, a.lora_a,
              a.lora_b, a.slice_width, a.max_rank, m, a.scale, a.y, a.y_row_stride, a.add_inputs, o);
}

void add_lora_logits(const kernels::AddLoraLogitsArgs& a, const RefOptions& o) {
  const char* op = "add_lora_logits";
  if (a.vocab_size < 0) usage(op, "negative vocab_size");
  const Mapping m =
      group_tokens(op, a.meta.token_lora_mapping, a.num_rows, a.max_loras, a.max_rank, a.lora_ranks);
  const void* A[1] = {a.lora_a};
  const void* B[1] = {a.lora_b};
  const int64_t W[1] = {a.vocab_size};
  linear_core(op, a.dtype, a.num_rows, a.hidden, a.x, a.x_row_stride, 1, A, B, W, a.max_rank, m,
              a.scale, a.y, a.y_row_stride, /*add_inputs=*/true, o);
}

void add_lora_embedding(const kernels::AddLoraEmbeddingArgs& a) {
  const char* op = "add_lora_embedding";
  const Mapping m =
      group_tokens(op, a.meta.token_lora_mapping, a.num_tokens, a.max_loras, a.max_rank, a.lora_ranks);
  if (a.vocab_size < 0 || a.embed_dim < 0) usage(op, "negative vocab_size or embed_dim");
  const int64_t T = a.num_tokens;
  if (T == 0) return;
  if (!a.token_ids || !a.lora_a) usage(op, "token_ids or lora_a is null");
  const std::size_t r = size_t(a.max_rank);
  // a[t][k] = A[slot][token_id][k], k < r_l; the rest of the buffer stays 0 and is not read.
  std::vector<float> buf(size_t(T) * r, 0.0f);
  for (std::size_t l = 0; l < m.tokens.size(); ++l)
    for (int64_t t : m.tokens[l]) {
      const int32_t id = a.token_ids[t];
      if (id < 0 || id >= a.vocab_size)
        usage(op, "token id " + std::to_string(id) + " outside [0, vocab_size)");
      load_row(a.lora_a, a.dtype, (l * size_t(a.vocab_size) + size_t(id)) * r, m.rank[l],
               buf.data() + size_t(t) * r);
    }
  const void* B[1] = {a.lora_b};
  const int64_t W[1] = {a.embed_dim};
  run_expand(op, ExpandCore{DType::f32, a.dtype, T, buf.data(), 1, B, W, a.max_rank, a.y,
                            a.y_row_stride, 0, a.add_inputs, true},
             m);
}

void apply_lora_full_linear(const kernels::ApplyLoraFullLinearArgs& a) {
  const char* op = "apply_lora_full_linear";
  if (a.in_features < 0 || a.out_features < 0) usage(op, "negative in/out features");
  const Mapping m =
      group_tokens(op, a.meta.token_lora_mapping, a.num_rows, a.max_loras, 0, nullptr);
  const int64_t R = a.num_rows, In = a.in_features, Out = a.out_features;
  if (R == 0) return;
  if (!a.x || !a.y || !a.weight || !a.module_enabled) usage(op, "null x, y, weight or module_enabled");
  if (a.x_row_stride < In) usage(op, "x_row_stride smaller than in_features");
  if (a.y_row_stride < Out) usage(op, "y_row_stride smaller than out_features");
  for (std::size_t l = 0; l < m.tokens.size(); ++l) {
    const auto& rows = m.tokens[l];
    if (rows.empty() || !a.module_enabled[l]) continue;
    const int64_t n = int64_t(rows.size());
    MatR X(n, In);
    for (int64_t i = 0; i < n; ++i)
      load_row(a.x, a.dtype, size_t(rows[size_t(i)] * a.x_row_stride), In, X.row(i).data());
    const MatR W = load_block(a.weight, a.dtype, l * size_t(Out) * size_t(In), Out, In, In);
    MatR Y(n, Out);
    Y.noalias() = X * W.transpose();
    if (a.bias) {
      Eigen::RowVectorXf b(Out);
      load_row(a.bias, a.dtype, l * size_t(Out), Out, b.data());
      Y.rowwise() += b;
    }
    for (int64_t i = 0; i < n; ++i) {
      const std::size_t row = size_t(rows[size_t(i)] * a.y_row_stride);
      for (int64_t o = 0; o < Out; ++o) kernels::store_elem(a.y, a.dtype, row + size_t(o), Y(i, o));
    }
  }
}

}  // namespace punica::ref
