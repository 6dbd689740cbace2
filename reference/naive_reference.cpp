// Independent fp64 loops for every op (the check of the Eigen path in lora_reference.cpp and
// metadata_reference.cpp). Nothing is shared with those files except dtype.h's load/store/round.
// Same semantics and the same roundings: shrink result stored in out_dtype; the expand input is
// rounded to the weight dtype, the expand product is rounded to the weight dtype before the add,
// and the sum is stored in the output dtype. Only meta.token_lora_mapping is read (no_lora_flag
// is ignored: an all -1 batch follows from the mapping). lora_ranks may be null (= max_rank).
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "reference/lora_reference.h"

namespace punica::ref::naive {

using kernels::DType;
using kernels::load_elem;
using kernels::round_to;
using kernels::store_elem;

namespace {

[[noreturn]] void bad(const char* op, const std::string& msg) {
  throw Error(ErrorKind::usage, std::string(op) + " (naive): " + msg);
}

int slot_of(const char* op, const int32_t* map, int64_t t, int L) {
  const int s = map[t];
  if (s < -1 || s >= L) bad(op, "mapping value " + std::to_string(s) + " out of range");
  return s;
}

int rank_of(const char* op, const int32_t* ranks, int l, int max_rank) {
  const int r = ranks ? ranks[l] : max_rank;
  if (r < 0 || r > max_rank) bad(op, "rank " + std::to_string(r) + " > max_rank");
  return r;
}

void check_common(const char* op, int64_t T, int L, int max_rank, const int32_t* map,
                  const int32_t* ranks) {
  if (T < 0 || L < 0 || max_rank < 0) bad(op, "negative size");
  if (T > 0 && !map) bad(op, "null mapping");
  for (int l = 0; l < L && ranks; ++l) rank_of(op, ranks, l, max_rank);
  for (int64_t t = 0; t < T; ++t) slot_of(op, map, t, L);
}

// y[s,t,j] for t in [0,T): writes every element (0 where no slot / beyond the true rank).
void shrink_loops(const char* op, DType dt, int64_t T, int64_t K, const void* x, int64_t ldx,
                  int S, const void* const* A, int L, int max_rank, const int32_t* ranks,
                  const int32_t* map, float scale, void* y, DType ydt) {
  if (S < 1 || S > kernels::kMaxSlices) bad(op, "num_slices out of range");
  if (K < 0) bad(op, "negative hidden");
  check_common(op, T, L, max_rank, map, ranks);
  for (int s = 0; s < S; ++s)
    for (int64_t t = 0; t < T; ++t) {
      const int l = map[t];
      const int rl = l >= 0 ? rank_of(op, ranks, l, max_rank) : 0;
      for (int j = 0; j < max_rank; ++j) {
        double acc = 0.0;
        if (j < rl)
          for (int64_t k = 0; k < K; ++k)
            acc += double(load_elem(x, dt, size_t(t * ldx + k))) *
                   double(load_elem(A[s], dt, size_t((int64_t(l) * max_rank + j) * K + k)));
        store_elem(y, ydt, size_t((int64_t(s) * T + t) * max_rank + j), float(double(scale) * acc));
      }
    }
}

void expand_loops(const char* op, DType xdt, DType dt, int64_t T, const void* x, int S,
                  const void* const* B, const int64_t* widths, int L, int max_rank,
                  const int32_t* ranks, const int32_t* map, void* y, int64_t ldy, int64_t offset,
                  bool add_inputs, bool round_x) {
  if (S < 1 || S > kernels::kMaxSlices) bad(op, "num_slices out of range");
  if (offset < 0) bad(op, "negative offset");
  check_common(op, T, L, max_rank, map, ranks);
  int64_t col0 = offset;
  for (int s = 0; s < S; ++s) {
    const int64_t N = widths[s];
    if (N < 0) bad(op, "negative slice width");
    for (int64_t t = 0; t < T; ++t) {
      const int l = map[t];
      if (l < 0) continue;
      const int rl = rank_of(op, ranks, l, max_rank);
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0.0;
        for (int k = 0; k < rl; ++k) {
          float xv = load_elem(x, xdt, size_t((int64_t(s) * T + t) * max_rank + k));
          if (round_x) xv = round_to(dt, xv);
          acc += double(xv) * double(load_elem(B[s], dt, size_t((int64_t(l) * N + n) * max_rank + k)));
        }
        const std::size_t at = size_t(t * ldy + col0 + n);
        const double prev = add_inputs ? double(load_elem(y, dt, at)) : 0.0;
        store_elem(y, dt, at, float(prev + double(round_to(dt, float(acc)))));
      }
    }
    col0 += N;
  }
}

}  // namespace

void lora_meta(const kernels::LoraMetaArgs& a) {
  const char* op = "lora_meta";
  const int64_t T = a.num_tokens;
  const int L = a.max_loras;
  if (T < 0 || L < 0) bad(op, "negative size");
  if (T > 0 && !a.token_lora_mapping_in) bad(op, "null mapping");
  for (int64_t t = 0; t < T; ++t) slot_of(op, a.token_lora_mapping_in, t, L);
  // Counting sort over the values -1..L-1 (stable by construction).
  int32_t n_active = 0, pos = 0, all_none = 1;
  for (int i = 0; i <= L; ++i) {
    if (a.active_lora_ids) a.active_lora_ids[i] = -1;
    if (a.num_tokens_per_lora) a.num_tokens_per_lora[i] = 0;
  }
  for (int i = 0; i < L + 2; ++i)
    if (a.lora_token_start_loc) a.lora_token_start_loc[i] = 0;
  for (int v = -1; v < L; ++v) {
    int32_t c = 0;
    for (int64_t t = 0; t < T; ++t)
      if (a.token_lora_mapping_in[t] == v) {
        if (a.sorted_token_ids) a.sorted_token_ids[pos] = int32_t(t);
        ++pos;
        ++c;
        if (v != -1) all_none = 0;
      }
    if (c == 0) continue;
    if (a.active_lora_ids) a.active_lora_ids[n_active] = v;
    if (a.num_tokens_per_lora) a.num_tokens_per_lora[n_active] = c;
    if (a.lora_token_start_loc) a.lora_token_start_loc[n_active + 1] = pos;
    ++n_active;
  }
  for (int64_t t = 0; t < T; ++t)
    if (a.token_lora_mapping) a.token_lora_mapping[t] = a.token_lora_mapping_in[t];
  if (a.no_lora_flag) *a.no_lora_flag = all_none;
  if (a.num_active) *a.num_active = n_active;
}

void lora_shrink(const kernels::LoraShrinkArgs& a) {
  if (a.num_tokens > 0 && a.x_row_stride < a.hidden) bad("lora_shrink", "x_row_stride < hidden");
  shrink_loops("lora_shrink", a.dtype, a.num_tokens, a.hidden, a.x, a.x_row_stride, a.num_slices,
               a.lora_a, a.max_loras, a.max_rank, a.lora_ranks, a.meta.token_lora_mapping, a.scale,
               a.y, a.out_dtype);
}

void lora_expand(const kernels::LoraExpandArgs& a) {
  expand_loops("lora_expand", a.in_dtype, a.dtype, a.num_tokens, a.x, a.num_slices, a.lora_b,
               a.slice_width, a.max_loras, a.max_rank, a.lora_ranks, a.meta.token_lora_mapping,
               a.y, a.y_row_stride, a.offset_start, a.add_inputs, true);
}

void add_lora_linear(const kernels::AddLoraLinearArgs& a, const RefOptions& o) {
  const int64_t T = a.num_tokens;
  std::vector<float> u(size_t(std::max<int64_t>(T, 0)) * size_t(std::max(a.num_slices, 0)) *
                       size_t(std::max(a.max_rank, 0)));
  shrink_loops("add_lora_linear", a.dtype, T, a.hidden, a.x, a.x_row_stride, a.num_slices,
               a.lora_a, a.max_loras, a.max_rank, a.lora_ranks, a.meta.token_lora_mapping, a.scale,
               u.data(), DType::f32);
  if (o.round_intermediate)
    for (auto& v : u) v = round_to(a.dtype, v);
  expand_loops("add_lora_linear", DType::f32, a.dtype, T, u.data(), a.num_slices, a.lora_b,
               a.slice_width, a.max_loras, a.max_rank, a.lora_ranks, a.meta.token_lora_mapping,
               a.y, a.y_row_stride, 0, a.add_inputs, o.round_intermediate);
}

void add_lora_logits(const kernels::AddLoraLogitsArgs& a, const RefOptions& o) {
  const int64_t R = a.num_rows;
  std::vector<float> u(size_t(std::max<int64_t>(R, 0)) * size_t(std::max(a.max_rank, 0)));
  const void* A[1] = {a.lora_a};
  const void* B[1] = {a.lora_b};
  const int64_t W[1] = {a.vocab_size};
  if (a.vocab_size < 0) bad("add_lora_logits", "negative vocab");
  shrink_loops("add_lora_logits", a.dtype, R, a.hidden, a.x, a.x_row_stride, 1, A, a.max_loras,
               a.max_rank, a.lora_ranks, a.meta.token_lora_mapping, a.scale, u.data(), DType::f32);
  if (o.round_intermediate)
    for (auto& v : u) v = round_to(a.dtype, v);
  expand_loops("add_lora_logits", DType::f32, a.dtype, R, u.data(), 1, B, W, a.max_loras,
               a.max_rank, a.lora_ranks, a.meta.token_lora_mapping, a.y, a.y_row_stride, 0, true,
               o.round_intermediate);
}

void add_lora_embedding(const kernels::AddLoraEmbeddingArgs& a) {
  const char* op = "add_lora_embedding";
  const int64_t T = a.num_tokens, D = a.embed_dim, V = a.vocab_size;
  const int r = a.max_rank;
  if (D < 0 || V < 0) bad(op, "negative size");
  check_common(op, T, a.max_loras, r, a.meta.token_lora_mapping, a.lora_ranks);
  for (int64_t t = 0; t < T; ++t) {
    const int l = a.meta.token_lora_mapping[t];
    if (l < 0) continue;
    const int rl = rank_of(op, a.lora_ranks, l, r);
    const int64_t id = a.token_ids[t];
    if (id < 0 || id >= V) bad(op, "token id out of range");
    for (int64_t n = 0; n < D; ++n) {
      double acc = 0.0;
      for (int k = 0; k < rl; ++k)
        acc += double(load_elem(a.lora_a, a.dtype, size_t((int64_t(l) * V + id) * r + k))) *
               double(load_elem(a.lora_b, a.dtype, size_t((int64_t(l) * D + n) * r + k)));
      const std::size_t at = size_t(t * a.y_row_stride + n);
      const double prev = a.add_inputs ? double(load_elem(a.y, a.dtype, at)) : 0.0;
      store_elem(a.y, a.dtype, at, float(prev + double(round_to(a.dtype, float(acc)))));
    }
  }
}

void apply_lora_full_linear(const kernels::ApplyLoraFullLinearArgs& a) {
  const char* op = "apply_lora_full_linear";
  const int64_t R = a.num_rows, In = a.in_features, Out = a.out_features;
  if (In < 0 || Out < 0) bad(op, "negative size");
  check_common(op, R, a.max_loras, 0, a.meta.token_lora_mapping, nullptr);
  for (int64_t j = 0; j < R; ++j) {
    const int idx = a.meta.token_lora_mapping[j];
    if (idx < 0 || !a.module_enabled[idx]) continue;
    for (int64_t o = 0; o < Out; ++o) {
      double acc = a.bias ? double(load_elem(a.bias, a.dtype, size_t(int64_t(idx) * Out + o))) : 0.0;
      for (int64_t i = 0; i < In; ++i)
        acc += double(load_elem(a.weight, a.dtype, size_t((int64_t(idx) * Out + o) * In + i))) *
               double(load_elem(a.x, a.dtype, size_t(j * a.x_row_stride + i)));
      store_elem(a.y, a.dtype, size_t(j * a.y_row_stride + o), float(acc));
    }
  }
}

}  // namespace punica::ref::naive
