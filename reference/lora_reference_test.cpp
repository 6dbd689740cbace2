// Dense LoRA op references: the Eigen path against the independent naive fp64 loops on fresh random
// data (DESIGN §6 tolerance), the write/untouched rules (poisoned shrink output, -1 rows and
// outside columns bit-equal), NaN padding beyond the true rank, exact small-integer mode (Eigen and
// naive bit-equal), hand-computed tiny examples, argument validation and model-sized timing.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/error.h"
#include "kernels/common/host_tensor.h"
#include "kernels/common/hash_rng.h"
#include "reference/lora_reference.h"

using namespace punica;
using kernels::DType;
using V32 = std::vector<int32_t>;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---------------------------------------------------------------- buffers
using Buf = kernels::HostTensor;  // kernels/common/host_tensor.h

Buf vals(DType dt, const std::vector<float>& v) {
  Buf b(dt, v.size());
  for (size_t i = 0; i < v.size(); ++i) b.set(i, v[i]);
  return b;
}

// Value generator: random uniform (amp * [-1,1)) or exact small integers ({-2..2}/8).
struct Gen {
  bool exact = false;
  float operator()(uint64_t key, uint64_t i, float amp) const {
    return exact ? hash_small_int(key, i) : amp * hash_uniform(key, i);
  }
};

double rtol_of(DType t) { return kernels::rtol_for(t); }

// DESIGN §6 (kernels/common/check.h): |y - r| <= atol + rtol |r|, atol = rtol * rms(r); every
// compared element finite. The Eigen and naive outputs come from the same inputs (no y0 slack).
::testing::AssertionResult close(const Buf& got, const Buf& want, double rtol) {
  if (got.size() != want.size() || got.dtype != want.dtype) return ::testing::AssertionFailure() << "size mismatch";
  kernels::CheckSpec spec;
  spec.dtype = want.dtype;
  spec.n = want.size();
  spec.name = "y";
  const kernels::CheckResult r = kernels::check_close(got.data(), want.data(), rtol, spec);
  if (r.nwrong == 0) return ::testing::AssertionSuccess();
  ::testing::AssertionResult f = ::testing::AssertionFailure();
  f << r.nwrong << " of " << want.size() << " wrong (atol " << r.atol << ", max_abs " << r.max_abs_err << ")";
  for (const std::string& m : r.first_mismatches) f << "; " << m;
  return f;
}

::testing::AssertionResult bit_equal(const Buf& a, const Buf& b) {
  if (a.bytes == b.bytes) return ::testing::AssertionSuccess();
  for (size_t i = 0; i < a.size(); ++i)
    if (a.bits(i) != b.bits(i))
      return ::testing::AssertionFailure() << "first difference at " << i << ": " << a.get(i)
                                           << " vs " << b.get(i);
  return ::testing::AssertionFailure() << "size mismatch";
}

bool all_finite(const Buf& b) {
  for (size_t i = 0; i < b.size(); ++i)
    if (!std::isfinite(b.get(i))) return false;
  return true;
}

// ---------------------------------------------------------------- problems
struct Case {
  std::string name;
  int64_t T, K;
  int L, r;
  std::vector<int64_t> N;  // slice widths
  V32 ranks;               // [L]
  uint64_t seed;
};

// Random slots in [-1, L) with the last slot always used (when T > 0).
V32 make_map(int64_t T, int L, uint64_t key) {
  V32 m(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) m[size_t(t)] = int32_t(hash_below(key, uint64_t(t), uint64_t(L + 1))) - 1;
  if (T > 0) m[size_t(T - 1)] = L - 1;
  if (T > 2) m[0] = -1;
  return m;
}

// Everything the linear-family ops need, in one dtype. Padding (beyond the true rank, empty slots,
// x row padding, stride padding of the expand input) is `pad`: 0 as vLLM lays it out, NaN to prove
// it is never read.
struct Problem {
  Case c;
  DType dt, in_dt;
  int S;
  int64_t ld_x, ld_y, offset, width;
  V32 map;
  Buf x;               // [T, ld_x]
  std::vector<Buf> A;  // S x [L, r, K]
  std::vector<Buf> B;  // S x [L, N_s, r]
  Buf u;               // [S, T, r] expand input in in_dt
  Buf y0;              // [T, ld_y]

  Problem(const Case& cs, DType d, DType in_d, float pad, Gen g = {}, int64_t off = 0)
      : c(cs), dt(d), in_dt(in_d), S(int(cs.N.size())), offset(off) {
    const int64_t T = c.T, K = c.K;
    ld_x = K + 3;
    width = offset + std::accumulate(c.N.begin(), c.N.end(), int64_t(0));
    ld_y = width + 2;
    map = make_map(T, c.L, hash_key(c.seed, 1, 0));
    const float ax = 1.0f, aa = 1.0f / std::sqrt(float(std::max<int64_t>(K, 1))), ab = 0.5f;
    x = Buf(dt, size_t(T * ld_x));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < ld_x; ++k)
        x.set(size_t(t * ld_x + k), k < K ? g(hash_key(c.seed, 2, 0), uint64_t(t * K + k), ax) : kNaN);
    for (int s = 0; s < S; ++s) {
      const int64_t N = c.N[size_t(s)];
      Buf a(dt, size_t(c.L) * c.r * K), b(dt, size_t(c.L) * N * c.r);
      for (int l = 0; l < c.L; ++l) {
        const int rl = c.ranks[size_t(l)];
        for (int j = 0; j < c.r; ++j)
          for (int64_t k = 0; k < K; ++k) {
            const size_t i = (size_t(l) * c.r + j) * K + k;
            a.set(i, j < rl ? g(hash_key(c.seed, 3, s), i, aa) : pad);
          }
        for (int64_t n = 0; n < N; ++n)
          for (int k = 0; k < c.r; ++k) {
            const size_t i = (size_t(l) * N + n) * c.r + k;
            b.set(i, k < rl ? g(hash_key(c.seed, 4, s), i, ab) : pad);
          }
      }
      A.push_back(std::move(a));
      B.push_back(std::move(b));
    }
    u = Buf(in_dt, size_t(S) * T * c.r);
    for (int s = 0; s < S; ++s)
      for (int64_t t = 0; t < T; ++t) {
        const int l = map[size_t(t)];
        const int rl = l >= 0 ? c.ranks[size_t(l)] : 0;
        for (int k = 0; k < c.r; ++k) {
          const size_t i = (size_t(s) * T + t) * c.r + k;
          u.set(i, k < rl ? g(hash_key(c.seed, 5, 0), i, 4.0f) : pad);
        }
      }
    y0 = Buf(dt, size_t(T * ld_y));
    for (size_t i = 0; i < y0.size(); ++i) y0.set(i, g(hash_key(c.seed, 6, 0), i, 2.0f));
  }

  kernels::LoraMetaView meta() const {
    kernels::LoraMetaView m;
    m.token_lora_mapping = map.data();
    return m;
  }
  kernels::LoraShrinkArgs shrink(void* y, DType out) const {
    kernels::LoraShrinkArgs a;
    a.dtype = dt; a.out_dtype = out; a.num_tokens = c.T; a.hidden = c.K; a.x = x.data();
    a.x_row_stride = ld_x; a.num_slices = S;
    for (int s = 0; s < S; ++s) a.lora_a[s] = A[size_t(s)].data();
    a.max_loras = c.L; a.max_rank = c.r; a.lora_ranks = c.ranks.data(); a.meta = meta();
    a.scale = 0.5f; a.y = y;
    return a;
  }
  kernels::LoraExpandArgs expand(void* y, bool add) const {
    kernels::LoraExpandArgs a;
    a.in_dtype = in_dt; a.dtype = dt; a.num_tokens = c.T; a.x = u.data(); a.num_slices = S;
    for (int s = 0; s < S; ++s) { a.lora_b[s] = B[size_t(s)].data(); a.slice_width[s] = c.N[size_t(s)]; }
    a.max_loras = c.L; a.max_rank = c.r; a.lora_ranks = c.ranks.data(); a.meta = meta();
    a.y = y; a.y_row_stride = ld_y; a.offset_start = offset; a.add_inputs = add;
    return a;
  }
  kernels::AddLoraLinearArgs linear(void* y, bool add) const {
    kernels::AddLoraLinearArgs a;
    a.dtype = dt; a.num_tokens = c.T; a.hidden = c.K; a.x = x.data(); a.x_row_stride = ld_x;
    a.num_slices = S;
    for (int s = 0; s < S; ++s) {
      a.lora_a[s] = A[size_t(s)].data(); a.lora_b[s] = B[size_t(s)].data(); a.slice_width[s] = c.N[size_t(s)];
    }
    a.max_loras = c.L; a.max_rank = c.r; a.lora_ranks = c.ranks.data(); a.meta = meta();
    a.scale = 0.5f; a.y = y; a.y_row_stride = ld_y; a.add_inputs = add;
    return a;
  }
  // logits: slice 0 only, vocab = N[0]
  kernels::AddLoraLogitsArgs logits(void* y) const {
    kernels::AddLoraLogitsArgs a;
    a.dtype = dt; a.num_rows = c.T; a.hidden = c.K; a.x = x.data(); a.x_row_stride = ld_x;
    a.lora_a = A[0].data(); a.lora_b = B[0].data(); a.vocab_size = c.N[0]; a.max_loras = c.L;
    a.max_rank = c.r; a.lora_ranks = c.ranks.data(); a.meta = meta(); a.scale = 0.5f; a.y = y;
    a.y_row_stride = ld_y;
    return a;
  }
};

// Embedding problem: A [L, V, r] (row = token id), B [L, D, r].
struct EmbProblem {
  Case c;
  DType dt;
  int64_t V, D, ld_y;
  V32 map, ids;
  Buf A, B, y0;
  EmbProblem(const Case& cs, DType d, float pad, Gen g = {}) : c(cs), dt(d) {
    V = 97; D = c.N[0]; ld_y = D + 3;
    map = make_map(c.T, c.L, hash_key(c.seed, 11, 0));
    ids.resize(size_t(c.T));
    for (int64_t t = 0; t < c.T; ++t) ids[size_t(t)] = int32_t(hash_below(hash_key(c.seed, 12, 0), uint64_t(t), uint64_t(V)));
    A = Buf(dt, size_t(c.L) * V * c.r);
    B = Buf(dt, size_t(c.L) * D * c.r);
    for (int l = 0; l < c.L; ++l) {
      const int rl = c.ranks[size_t(l)];
      for (int64_t v = 0; v < V; ++v)
        for (int k = 0; k < c.r; ++k) {
          const size_t i = (size_t(l) * V + v) * c.r + k;
          A.set(i, k < rl ? g(hash_key(c.seed, 13, 0), i, 1.0f) : pad);
        }
      for (int64_t n = 0; n < D; ++n)
        for (int k = 0; k < c.r; ++k) {
          const size_t i = (size_t(l) * D + n) * c.r + k;
          B.set(i, k < rl ? g(hash_key(c.seed, 14, 0), i, 0.5f) : pad);
        }
    }
    y0 = Buf(dt, size_t(c.T * ld_y));
    for (size_t i = 0; i < y0.size(); ++i) y0.set(i, g(hash_key(c.seed, 15, 0), i, 2.0f));
  }
  kernels::AddLoraEmbeddingArgs args(void* y, bool add) const {
    kernels::AddLoraEmbeddingArgs a;
    a.dtype = dt; a.num_tokens = c.T; a.token_ids = ids.data(); a.vocab_size = V; a.embed_dim = D;
    a.lora_a = A.data(); a.lora_b = B.data(); a.max_loras = c.L; a.max_rank = c.r;
    a.lora_ranks = c.ranks.data(); a.meta.token_lora_mapping = map.data(); a.y = y;
    a.y_row_stride = ld_y; a.add_inputs = add;
    return a;
  }
};

// Full-linear (classifier head) problem.
struct FullProblem {
  DType dt;
  int64_t R, In, Out, ld_x, ld_y;
  int L;
  V32 map, enabled;
  Buf x, W, bias, y0;
  FullProblem(DType d, int64_t R_, int64_t In_, int64_t Out_, int L_, uint64_t seed, Gen g = {})
      : dt(d), R(R_), In(In_), Out(Out_), L(L_) {
    ld_x = In + 1; ld_y = Out + 2;
    map = make_map(R, L, hash_key(seed, 21, 0));
    enabled.resize(size_t(L));
    for (int l = 0; l < L; ++l) enabled[size_t(l)] = (l % 3 != 1);  // slot 1 (and 4, ...) disabled
    x = Buf(dt, size_t(R * ld_x));
    for (size_t i = 0; i < x.size(); ++i) x.set(i, (i % size_t(ld_x)) < size_t(In) ? g(hash_key(seed, 22, 0), i, 1.0f) : kNaN);
    W = Buf(dt, size_t(L) * Out * In);
    for (size_t i = 0; i < W.size(); ++i) W.set(i, g(hash_key(seed, 23, 0), i, 1.0f / std::sqrt(float(In))));
    bias = Buf(dt, size_t(L) * Out);
    for (size_t i = 0; i < bias.size(); ++i) bias.set(i, g(hash_key(seed, 24, 0), i, 1.0f));
    y0 = Buf(dt, size_t(R * ld_y));
    for (size_t i = 0; i < y0.size(); ++i) y0.set(i, g(hash_key(seed, 25, 0), i, 2.0f));
  }
  kernels::ApplyLoraFullLinearArgs args(void* y, bool with_bias) const {
    kernels::ApplyLoraFullLinearArgs a;
    a.dtype = dt; a.num_rows = R; a.in_features = In; a.out_features = Out; a.x = x.data();
    a.x_row_stride = ld_x; a.weight = W.data(); a.bias = with_bias ? bias.data() : nullptr;
    a.module_enabled = enabled.data(); a.max_loras = L; a.meta.token_lora_mapping = map.data();
    a.y = y; a.y_row_stride = ld_y;
    return a;
  }
};

// The shape matrix shared by the randomized tests.
std::vector<Case> cases() {
  return {
      {"T1", 1, 64, 1, 16, {48}, {16}, 101},
      {"hidden2049_unequal_slices_empty_slot", 37, 2049, 4, 16, {96, 32, 32}, {16, 0, 7, 16}, 102},
      {"rank1", 9, 130, 3, 1, {20}, {1, 1, 0}, 103},
      {"mixed_ranks_8_16_64", 48, 256, 4, 64, {64, 40}, {8, 16, 64, 0}, 104},
      {"eight_slices", 5, 33, 2, 4, {3, 1, 4, 1, 5, 9, 2, 6}, {4, 3}, 105},
  };
}

// Checks that only [offset, offset+width) of rows with a slot changed relative to y0.
void expect_untouched_outside(const Buf& y, const Buf& y0, const V32& map, int64_t ld,
                              int64_t col_begin, int64_t col_end) {
  const int64_t T = int64_t(map.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < ld; ++c) {
      const bool inside = map[size_t(t)] >= 0 && c >= col_begin && c < col_end;
      if (inside) continue;
      const size_t i = size_t(t * ld + c);
      ASSERT_EQ(y.bits(i), y0.bits(i)) << "row " << t << " col " << c << " (slot " << map[size_t(t)] << ")";
    }
}

class DenseOps : public ::testing::TestWithParam<DType> {};

// ---------------------------------------------------------------- randomized: Eigen vs naive

TEST_P(DenseOps, ShrinkMatchesNaiveAndWritesEverything) {
  const DType dt = GetParam();
  for (const Case& c : cases())
    for (DType out : {DType::f32, dt}) {
      SCOPED_TRACE(c.name + " out=" + kernels::dtype_name(out));
      Problem p(c, dt, dt, 0.0f);
      const size_t n = size_t(p.S) * c.T * c.r;
      Buf ye(out, n, kNaN), yn(out, n, kNaN);  // poisoned: every element must be written
      ref::lora_shrink(p.shrink(ye.data(), out));
      ref::naive::lora_shrink(p.shrink(yn.data(), out));
      EXPECT_TRUE(all_finite(ye));
      EXPECT_TRUE(close(ye, yn, rtol_of(dt)));
      for (int s = 0; s < p.S; ++s)
        for (int64_t t = 0; t < c.T; ++t) {
          const int l = p.map[size_t(t)];
          const int rl = l >= 0 ? c.ranks[size_t(l)] : 0;
          for (int j = rl; j < c.r; ++j) ASSERT_EQ(ye.get((size_t(s) * c.T + t) * c.r + j), 0.0f);
        }
    }
}

TEST_P(DenseOps, ExpandMatchesNaiveAndLeavesOthersUntouched) {
  const DType dt = GetParam();
  for (const Case& c : cases())
    for (DType in : {DType::f32, dt})
      for (bool add : {true, false})
        for (int64_t off : {int64_t(0), int64_t(5)}) {
          SCOPED_TRACE(c.name + " in=" + kernels::dtype_name(in) + " add=" + std::to_string(add) +
                       " offset=" + std::to_string(off));
          Problem p(c, dt, in, 0.0f, {}, off);
          Buf ye = p.y0, yn = p.y0;
          ref::lora_expand(p.expand(ye.data(), add));
          ref::naive::lora_expand(p.expand(yn.data(), add));
          EXPECT_TRUE(close(ye, yn, rtol_of(dt)));
          expect_untouched_outside(ye, p.y0, p.map, p.ld_y, off, p.width);
          expect_untouched_outside(yn, p.y0, p.map, p.ld_y, off, p.width);
        }
}

TEST_P(DenseOps, LinearMatchesNaive) {
  const DType dt = GetParam();
  for (const Case& c : cases())
    for (bool round : {true, false})
      for (bool add : {true, false}) {
        SCOPED_TRACE(c.name + " round=" + std::to_string(round) + " add=" + std::to_string(add));
        Problem p(c, dt, DType::f32, 0.0f);
        Buf ye = p.y0, yn = p.y0;
        ref::RefOptions o;
        o.round_intermediate = round;
        ref::add_lora_linear(p.linear(ye.data(), add), o);
        ref::naive::add_lora_linear(p.linear(yn.data(), add), o);
        EXPECT_TRUE(close(ye, yn, rtol_of(dt)));
        expect_untouched_outside(ye, p.y0, p.map, p.ld_y, 0, p.width);
      }
}

TEST_P(DenseOps, LinearEqualsShrinkThenExpand) {
  // The composite is exactly shrink (fp32 out) followed by expand (fp32 in, rounded to dt).
  const DType dt = GetParam();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Problem p(c, dt, DType::f32, 0.0f);
    Buf u(DType::f32, size_t(p.S) * c.T * c.r, kNaN);
    ref::lora_shrink(p.shrink(u.data(), DType::f32));
    p.u = u;
    Buf y1 = p.y0, y2 = p.y0;
    ref::lora_expand(p.expand(y1.data(), true));
    ref::add_lora_linear(p.linear(y2.data(), true));
    EXPECT_TRUE(bit_equal(y1, y2));
  }
}

TEST_P(DenseOps, EmbeddingMatchesNaive) {
  const DType dt = GetParam();
  for (const Case& c : cases())
    for (bool add : {true, false}) {
      SCOPED_TRACE(c.name + " add=" + std::to_string(add));
      EmbProblem p(c, dt, 0.0f);
      Buf ye = p.y0, yn = p.y0;
      ref::add_lora_embedding(p.args(ye.data(), add));
      ref::naive::add_lora_embedding(p.args(yn.data(), add));
      EXPECT_TRUE(close(ye, yn, rtol_of(dt)));
      expect_untouched_outside(ye, p.y0, p.map, p.ld_y, 0, p.D);
    }
}

TEST_P(DenseOps, LogitsMatchesNaive) {
  const DType dt = GetParam();
  for (Case c : cases()) {
    c.N = {1000 + c.T};  // vocab
    SCOPED_TRACE(c.name);
    Problem p(c, dt, DType::f32, 0.0f);
    Buf ye = p.y0, yn = p.y0;
    ref::add_lora_logits(p.logits(ye.data()));
    ref::naive::add_lora_logits(p.logits(yn.data()));
    EXPECT_TRUE(close(ye, yn, rtol_of(dt)));
    expect_untouched_outside(ye, p.y0, p.map, p.ld_y, 0, c.N[0]);
    // logits == linear with one slice and add_inputs
    Buf yl = p.y0;
    Problem q = p;
    q.S = 1;
    ref::add_lora_linear(q.linear(yl.data(), true));
    EXPECT_TRUE(bit_equal(ye, yl));
  }
}

TEST_P(DenseOps, FullLinearMatchesNaive) {
  const DType dt = GetParam();
  for (bool with_bias : {true, false})
    for (int64_t R : {1, 23}) {
      SCOPED_TRACE("bias=" + std::to_string(with_bias) + " R=" + std::to_string(R));
      FullProblem p(dt, R, 300, 37, 5, 200 + uint64_t(R));
      Buf ye = p.y0, yn = p.y0;
      ref::apply_lora_full_linear(p.args(ye.data(), with_bias));
      ref::naive::apply_lora_full_linear(p.args(yn.data(), with_bias));
      EXPECT_TRUE(close(ye, yn, rtol_of(dt)));
      for (int64_t j = 0; j < R; ++j) {
        const int idx = p.map[size_t(j)];
        const bool replaced = idx >= 0 && p.enabled[size_t(idx)];
        for (int64_t o = 0; o < p.ld_y; ++o)
          if (!replaced || o >= p.Out) {
            ASSERT_EQ(ye.bits(size_t(j * p.ld_y + o)), p.y0.bits(size_t(j * p.ld_y + o)));
          }
      }
    }
}

// ---------------------------------------------------------------- exact small-integer mode

TEST_P(DenseOps, ExactSmallIntegersAreBitEqual) {
  const DType dt = GetParam();
  Gen g{true};
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Problem p(c, dt, DType::f32, 0.0f, g, 2);
    Buf se(DType::f32, size_t(p.S) * c.T * c.r, kNaN), sn = se;
    ref::lora_shrink(p.shrink(se.data(), DType::f32));
    ref::naive::lora_shrink(p.shrink(sn.data(), DType::f32));
    EXPECT_TRUE(bit_equal(se, sn));
    Buf ee = p.y0, en = p.y0;
    ref::lora_expand(p.expand(ee.data(), true));
    ref::naive::lora_expand(p.expand(en.data(), true));
    EXPECT_TRUE(bit_equal(ee, en));
    Problem q(c, dt, DType::f32, 0.0f, g);
    Buf le = q.y0, ln = q.y0;
    ref::add_lora_linear(q.linear(le.data(), false));
    ref::naive::add_lora_linear(q.linear(ln.data(), false));
    EXPECT_TRUE(bit_equal(le, ln));
    EmbProblem e(c, dt, 0.0f, g);
    Buf me = e.y0, mn = e.y0;
    ref::add_lora_embedding(e.args(me.data(), true));
    ref::naive::add_lora_embedding(e.args(mn.data(), true));
    EXPECT_TRUE(bit_equal(me, mn));
  }
  FullProblem f(dt, 17, 200, 9, 4, 7, g);
  Buf fe = f.y0, fn = f.y0;
  ref::apply_lora_full_linear(f.args(fe.data(), true));
  ref::naive::apply_lora_full_linear(f.args(fn.data(), true));
  EXPECT_TRUE(bit_equal(fe, fn));
}

// ---------------------------------------------------------------- padding beyond the true rank

TEST_P(DenseOps, NaNPaddingBeyondTrueRankIsNeverRead) {
  const DType dt = GetParam();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Problem z(c, dt, DType::f32, 0.0f, {}, 3), q(c, dt, DType::f32, kNaN, {}, 3);
    const size_t n = size_t(z.S) * c.T * c.r;
    Buf s0(DType::f32, n, kNaN), s1 = s0, s2 = s0;
    ref::lora_shrink(z.shrink(s0.data(), DType::f32));
    ref::lora_shrink(q.shrink(s1.data(), DType::f32));
    ref::naive::lora_shrink(q.shrink(s2.data(), DType::f32));
    EXPECT_TRUE(all_finite(s1));
    EXPECT_TRUE(bit_equal(s0, s1));
    EXPECT_TRUE(close(s1, s2, rtol_of(dt)));

    Buf e0 = z.y0, e1 = z.y0, e2 = z.y0;
    ref::lora_expand(z.expand(e0.data(), true));
    ref::lora_expand(q.expand(e1.data(), true));
    ref::naive::lora_expand(q.expand(e2.data(), true));
    EXPECT_TRUE(all_finite(e1));
    EXPECT_TRUE(bit_equal(e0, e1));
    EXPECT_TRUE(close(e1, e2, rtol_of(dt)));

    Buf l0 = z.y0, l1 = z.y0, l2 = z.y0;
    ref::add_lora_linear(z.linear(l0.data(), true));
    ref::add_lora_linear(q.linear(l1.data(), true));
    ref::naive::add_lora_linear(q.linear(l2.data(), true));
    EXPECT_TRUE(all_finite(l1));
    EXPECT_TRUE(bit_equal(l0, l1));
    EXPECT_TRUE(close(l1, l2, rtol_of(dt)));

    Buf g0 = z.y0, g1 = z.y0, g2 = z.y0;
    ref::add_lora_logits(z.logits(g0.data()));
    ref::add_lora_logits(q.logits(g1.data()));
    ref::naive::add_lora_logits(q.logits(g2.data()));
    EXPECT_TRUE(all_finite(g1));
    EXPECT_TRUE(bit_equal(g0, g1));
    EXPECT_TRUE(close(g1, g2, rtol_of(dt)));

    EmbProblem ez(c, dt, 0.0f), eq(c, dt, kNaN);
    Buf m0 = ez.y0, m1 = ez.y0, m2 = ez.y0;
    ref::add_lora_embedding(ez.args(m0.data(), true));
    ref::add_lora_embedding(eq.args(m1.data(), true));
    ref::naive::add_lora_embedding(eq.args(m2.data(), true));
    EXPECT_TRUE(all_finite(m1));
    EXPECT_TRUE(bit_equal(m0, m1));
    EXPECT_TRUE(close(m1, m2, rtol_of(dt)));
  }
}

// ---------------------------------------------------------------- batches without LoRA, T = 0

TEST_P(DenseOps, EveryTokenNoLora) {
  const DType dt = GetParam();
  Case c = cases()[1];
  Problem p(c, dt, DType::f32, 0.0f, {}, 1);
  std::fill(p.map.begin(), p.map.end(), -1);
  const int32_t flag = 0;  // a stale/wrong flag: ignored, the mapping decides
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which ? "naive" : "eigen");
    Buf s(DType::f32, size_t(p.S) * c.T * c.r, kNaN);
    auto sa = p.shrink(s.data(), DType::f32);
    sa.meta.no_lora_flag = &flag;
    which ? ref::naive::lora_shrink(sa) : ref::lora_shrink(sa);
    for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(s.bits(i), 0u);  // +0.0 everywhere
    for (bool add : {true, false}) {
      Buf y = p.y0;
      which ? ref::naive::lora_expand(p.expand(y.data(), add)) : ref::lora_expand(p.expand(y.data(), add));
      EXPECT_TRUE(bit_equal(y, p.y0));
      which ? ref::naive::add_lora_linear(p.linear(y.data(), add)) : ref::add_lora_linear(p.linear(y.data(), add));
      EXPECT_TRUE(bit_equal(y, p.y0));
    }
    Buf y = p.y0;
    which ? ref::naive::add_lora_logits(p.logits(y.data())) : ref::add_lora_logits(p.logits(y.data()));
    EXPECT_TRUE(bit_equal(y, p.y0));
    EmbProblem e(c, dt, 0.0f);
    std::fill(e.map.begin(), e.map.end(), -1);
    Buf ey = e.y0;
    which ? ref::naive::add_lora_embedding(e.args(ey.data(), false)) : ref::add_lora_embedding(e.args(ey.data(), false));
    EXPECT_TRUE(bit_equal(ey, e.y0));
    FullProblem f(dt, 6, 20, 5, 3, 9);
    std::fill(f.map.begin(), f.map.end(), -1);
    Buf fy = f.y0;
    which ? ref::naive::apply_lora_full_linear(f.args(fy.data(), true)) : ref::apply_lora_full_linear(f.args(fy.data(), true));
    EXPECT_TRUE(bit_equal(fy, f.y0));
  }
}

TEST_P(DenseOps, ZeroTokensIsANoOp) {
  const DType dt = GetParam();
  Case c = cases()[3];
  c.T = 0;
  Problem p(c, dt, DType::f32, 0.0f);
  Buf sentinel(dt, 16, 3.0f);
  for (int which = 0; which < 2; ++which) {
    Buf y = sentinel;
    auto sa = p.shrink(y.data(), dt);
    auto ea = p.expand(y.data(), false);
    auto la = p.linear(y.data(), false);
    auto ga = p.logits(y.data());
    if (which) {
      ref::naive::lora_shrink(sa); ref::naive::lora_expand(ea);
      ref::naive::add_lora_linear(la); ref::naive::add_lora_logits(ga);
    } else {
      ref::lora_shrink(sa); ref::lora_expand(ea); ref::add_lora_linear(la); ref::add_lora_logits(ga);
    }
    EXPECT_TRUE(bit_equal(y, sentinel));
  }
  // T = 0 with null data pointers is valid too.
  kernels::LoraShrinkArgs a;
  a.dtype = dt; a.num_tokens = 0; a.hidden = 128; a.max_loras = 2; a.max_rank = 8;
  EXPECT_NO_THROW(ref::lora_shrink(a));
  EXPECT_NO_THROW(ref::naive::lora_shrink(a));
  kernels::LoraExpandArgs b;
  b.dtype = dt; b.num_tokens = 0; b.slice_width[0] = 4; b.max_loras = 2; b.max_rank = 8;
  EXPECT_NO_THROW(ref::lora_expand(b));
  EXPECT_NO_THROW(ref::naive::lora_expand(b));
}

// ---------------------------------------------------------------- None sub-LoRA

TEST_P(DenseOps, NoneSubLoraSliceAddsNothing) {
  const DType dt = GetParam();
  Case c = cases()[1];  // S = 3, L = 4
  Problem p(c, dt, DType::f32, 0.0f);
  const int slot = 3, s = 1;  // slot 3's k-slice is "None": its A and B stay zero
  const int64_t N1 = c.N[1];
  for (size_t i = 0; i < size_t(c.r) * c.K; ++i) p.A[s].set(size_t(slot) * c.r * c.K + i, 0.0f);
  for (size_t i = 0; i < size_t(N1) * c.r; ++i) p.B[s].set(size_t(slot) * N1 * c.r + i, 0.0f);
  Buf u(DType::f32, size_t(p.S) * c.T * c.r, kNaN), un = u;
  ref::lora_shrink(p.shrink(u.data(), DType::f32));
  ref::naive::lora_shrink(p.shrink(un.data(), DType::f32));
  EXPECT_TRUE(close(u, un, rtol_of(dt)));
  Buf y = p.y0, yn = p.y0;
  ref::add_lora_linear(p.linear(y.data(), true));
  ref::naive::add_lora_linear(p.linear(yn.data(), true));
  EXPECT_TRUE(close(y, yn, rtol_of(dt)));
  int hits = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    if (p.map[size_t(t)] != slot) continue;
    ++hits;
    for (int j = 0; j < c.r; ++j) EXPECT_EQ(u.bits((size_t(s) * c.T + t) * c.r + j), 0u);
    for (int64_t n = c.N[0]; n < c.N[0] + N1; ++n)
      EXPECT_EQ(y.bits(size_t(t * p.ld_y + n)), p.y0.bits(size_t(t * p.ld_y + n)));
    bool changed = false;  // the other slices of the same slot do change
    for (int64_t n = 0; n < c.N[0]; ++n) changed |= y.bits(size_t(t * p.ld_y + n)) != p.y0.bits(size_t(t * p.ld_y + n));
    EXPECT_TRUE(changed);
  }
  EXPECT_GT(hits, 0);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, DenseOps, ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(kernels::dtype_name(i.param));
                         });

// ---------------------------------------------------------------- hand-computed examples

class HandExamples : public ::testing::TestWithParam<DType> {};

// L=2, ranks {2,1}, K=3, mapping [1,-1,0], scale 0.5; slot 1's padding row is 100 (never read).
TEST_P(HandExamples, Shrink) {
  const DType dt = GetParam();
  const Buf x = vals(dt, {1, 2, 3, 4, 5, 6, -1, 0, 2});
  const Buf A = vals(dt, {1, 0, -1, 2, 1, 0, /*slot 1*/ 0, 1, 1, 100, 100, 100});
  const V32 map = {1, -1, 0}, ranks = {2, 1};
  for (DType out : {DType::f32, dt})
    for (int which = 0; which < 2; ++which) {
      Buf y(out, 6, kNaN);
      kernels::LoraShrinkArgs a;
      a.dtype = dt; a.out_dtype = out; a.num_tokens = 3; a.hidden = 3; a.x = x.data(); a.x_row_stride = 3;
      a.lora_a[0] = A.data(); a.max_loras = 2; a.max_rank = 2; a.lora_ranks = ranks.data();
      a.meta.token_lora_mapping = map.data(); a.scale = 0.5f; a.y = y.data();
      which ? ref::naive::lora_shrink(a) : ref::lora_shrink(a);
      const std::vector<float> want = {2.5f, 0, 0, 0, -1.5f, -1};
      for (size_t i = 0; i < 6; ++i) EXPECT_EQ(y.get(i), want[i]) << i << " naive=" << which;
    }
}

// Two slices (widths 2, 1) at offset 1 of a 5-wide row; ranks {2,1}; mapping [1,-1,0].
TEST_P(HandExamples, Expand) {
  const DType dt = GetParam();
  const Buf u = vals(DType::f32, {1, 2, 9, 9, 3, -1, /*slice 1*/ 2, 50, 9, 9, 1, 1});
  const Buf B0 = vals(dt, {1, 2, 0, 1, /*slot 1*/ 3, 100, -1, 100});
  const Buf B1 = vals(dt, {2, -1, /*slot 1*/ 4, 100});
  const V32 map = {1, -1, 0}, ranks = {2, 1};
  std::vector<float> y0v(15);
  for (int t = 0; t < 3; ++t)
    for (int c = 0; c < 5; ++c) y0v[size_t(t * 5 + c)] = float(10 * t + c);
  const Buf y0 = vals(dt, y0v);
  for (bool add : {true, false})
    for (int which = 0; which < 2; ++which) {
      Buf y = y0;
      kernels::LoraExpandArgs a;
      a.in_dtype = DType::f32; a.dtype = dt; a.num_tokens = 3; a.x = u.data(); a.num_slices = 2;
      a.lora_b[0] = B0.data(); a.lora_b[1] = B1.data(); a.slice_width[0] = 2; a.slice_width[1] = 1;
      a.max_loras = 2; a.max_rank = 2; a.lora_ranks = ranks.data(); a.meta.token_lora_mapping = map.data();
      a.y = y.data(); a.y_row_stride = 5; a.offset_start = 1; a.add_inputs = add;
      which ? ref::naive::lora_expand(a) : ref::lora_expand(a);
      const std::vector<float> want =
          add ? std::vector<float>{0, 4, 1, 11, 4, 10, 11, 12, 13, 14, 20, 22, 21, 24, 24}
              : std::vector<float>{0, 3, -1, 8, 4, 10, 11, 12, 13, 14, 20, 1, -1, 1, 24};
      for (size_t i = 0; i < 15; ++i) EXPECT_EQ(y.get(i), want[i]) << i << " add=" << add << " naive=" << which;
    }
}

// T=2, K=2, S=2 (widths 1, 2), L=1, r=1, scale 2: u = (6, -2), delta row 0 = (3, -2, -4).
TEST_P(HandExamples, Linear) {
  const DType dt = GetParam();
  const Buf x = vals(dt, {1, 2, 5, 5});
  const Buf A0 = vals(dt, {1, 1}), A1 = vals(dt, {1, -1}), B0 = vals(dt, {0.5f}), B1 = vals(dt, {1, 2});
  const V32 map = {0, -1}, ranks = {1};
  for (int which = 0; which < 2; ++which) {
    Buf y = vals(dt, {1, 1, 1, 7, 7, 7});
    kernels::AddLoraLinearArgs a;
    a.dtype = dt; a.num_tokens = 2; a.hidden = 2; a.x = x.data(); a.x_row_stride = 2; a.num_slices = 2;
    a.lora_a[0] = A0.data(); a.lora_a[1] = A1.data(); a.lora_b[0] = B0.data(); a.lora_b[1] = B1.data();
    a.slice_width[0] = 1; a.slice_width[1] = 2; a.max_loras = 1; a.max_rank = 1;
    a.lora_ranks = ranks.data(); a.meta.token_lora_mapping = map.data(); a.scale = 2.0f;
    a.y = y.data(); a.y_row_stride = 3;
    which ? ref::naive::add_lora_linear(a) : ref::add_lora_linear(a);
    const std::vector<float> want = {4, -1, -3, 7, 7, 7};
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(y.get(i), want[i]) << i << " naive=" << which;
  }
}

// L=2, vocab 3, D=2, r=2; ids [2,0,1], mapping [0,1,-1].
TEST_P(HandExamples, Embedding) {
  const DType dt = GetParam();
  const Buf A = vals(dt, {1, 0, 0, 1, 1, 2, /*slot 1*/ 3, -1, 5, 5, 6, 6});
  const Buf B = vals(dt, {1, 1, 2, 0, /*slot 1*/ 1, 0, 0, 1});
  const V32 map = {0, 1, -1}, ids = {2, 0, 1}, ranks = {2, 2};
  for (int which = 0; which < 2; ++which) {
    Buf y = vals(dt, {1, 1, 1, 1, 1, 1});
    kernels::AddLoraEmbeddingArgs a;
    a.dtype = dt; a.num_tokens = 3; a.token_ids = ids.data(); a.vocab_size = 3; a.embed_dim = 2;
    a.lora_a = A.data(); a.lora_b = B.data(); a.max_loras = 2; a.max_rank = 2; a.lora_ranks = ranks.data();
    a.meta.token_lora_mapping = map.data(); a.y = y.data(); a.y_row_stride = 2;
    which ? ref::naive::add_lora_embedding(a) : ref::add_lora_embedding(a);
    const std::vector<float> want = {4, 3, 4, 0, 1, 1};
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(y.get(i), want[i]) << i << " naive=" << which;
  }
}

// R=2, hidden 2, vocab 3 (row stride 4, last column untouched), L=2, r=1, sampler mapping [1,0].
TEST_P(HandExamples, Logits) {
  const DType dt = GetParam();
  const Buf x = vals(dt, {1, 2, 3, -1});
  const Buf A = vals(dt, {1, 0, /*slot 1*/ 1, 1});
  const Buf B = vals(dt, {1, 2, 3, /*slot 1*/ -1, 0, 1});
  const V32 map = {1, 0}, ranks = {1, 1};
  for (int which = 0; which < 2; ++which) {
    Buf y = vals(dt, {0, 0, 0, 7, 0, 0, 0, 7});
    kernels::AddLoraLogitsArgs a;
    a.dtype = dt; a.num_rows = 2; a.hidden = 2; a.x = x.data(); a.x_row_stride = 2; a.lora_a = A.data();
    a.lora_b = B.data(); a.vocab_size = 3; a.max_loras = 2; a.max_rank = 1; a.lora_ranks = ranks.data();
    a.meta.token_lora_mapping = map.data(); a.scale = 1.0f; a.y = y.data(); a.y_row_stride = 4;
    which ? ref::naive::add_lora_logits(a) : ref::add_lora_logits(a);
    const std::vector<float> want = {-3, 0, 3, 7, 3, 6, 9, 7};
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(y.get(i), want[i]) << i << " naive=" << which;
  }
}

// R=3, in 2, out 2, L=2, enabled {1,0}, mapping [0,1,-1]: only row 0 is replaced.
TEST_P(HandExamples, FullLinear) {
  const DType dt = GetParam();
  const Buf x = vals(dt, {1, 1, 2, 2, 3, 3});
  const Buf W = vals(dt, {1, 2, 3, 4, /*slot 1*/ 5, 5, 5, 5});
  const Buf b = vals(dt, {1, -1, 8, 8});
  const V32 map = {0, 1, -1}, enabled = {1, 0};
  for (bool bias : {true, false})
    for (int which = 0; which < 2; ++which) {
      Buf y = vals(dt, {9, 9, 9, 9, 9, 9});
      kernels::ApplyLoraFullLinearArgs a;
      a.dtype = dt; a.num_rows = 3; a.in_features = 2; a.out_features = 2; a.x = x.data();
      a.x_row_stride = 2; a.weight = W.data(); a.bias = bias ? b.data() : nullptr;
      a.module_enabled = enabled.data(); a.max_loras = 2; a.meta.token_lora_mapping = map.data();
      a.y = y.data(); a.y_row_stride = 2;
      which ? ref::naive::apply_lora_full_linear(a) : ref::apply_lora_full_linear(a);
      const std::vector<float> want = bias ? std::vector<float>{4, 6, 9, 9, 9, 9}
                                           : std::vector<float>{3, 7, 9, 9, 9, 9};
      for (size_t i = 0; i < 6; ++i) EXPECT_EQ(y.get(i), want[i]) << i << " bias=" << bias << " naive=" << which;
    }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, HandExamples, ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(kernels::dtype_name(i.param));
                         });

// ---------------------------------------------------------------- rounding of the intermediate

TEST(RefOptions, RoundIntermediateMatters) {
  // fp16, r = 2: u = (1 + 3*2^-12, 1) exactly in fp32; rounded to fp16, u0 = 1 + 2^-10.
  // B = (1, -1) cancels the 1, so y = u0 - u1 shows whether the intermediate was rounded.
  const DType dt = DType::f16;
  const Buf x = vals(dt, {1.0f, std::ldexp(3.0f, -12)});
  const Buf A = vals(dt, {1, 1, /*row 1*/ 1, 0});
  const Buf B = vals(dt, {1, -1});
  const V32 map = {0}, ranks = {2};
  auto run = [&](bool round) {
    kernels::AddLoraLinearArgs a;
    a.dtype = dt; a.num_tokens = 1; a.hidden = 2; a.x = x.data(); a.x_row_stride = 2;
    a.lora_a[0] = A.data(); a.lora_b[0] = B.data(); a.slice_width[0] = 1; a.max_loras = 1; a.max_rank = 2;
    a.lora_ranks = ranks.data(); a.meta.token_lora_mapping = map.data(); a.y_row_stride = 1;
    ref::RefOptions o;
    o.round_intermediate = round;
    Buf y = vals(dt, {0}), yn = vals(dt, {0});
    a.y = y.data();
    ref::add_lora_linear(a, o);
    a.y = yn.data();
    ref::naive::add_lora_linear(a, o);
    EXPECT_EQ(y.get(0), yn.get(0)) << "round=" << round;
    return y.get(0);
  };
  EXPECT_EQ(run(true), std::ldexp(1.0f, -10));
  EXPECT_EQ(run(false), std::ldexp(3.0f, -12));
}

TEST(Roundings, ExpandRoundsInputAndProductLikeTheGpu) {
  // bf16, r = 2, two tokens of slot 0, one slice of width 2.
  // token 0, col 0: u = (1 + 2^-9, 1) in fp32, B row 0 = (1, -1): u0 rounds to bf16 1 (tie to even)
  //   before the product, so y = 0 (without the input rounding it would be 2^-9).
  // token 1, col 1: u = (2^-8, 2^-16), B row 1 = (1, 1), y0 = 1: v = 2^-8 + 2^-16 is rounded to
  //   2^-8 first and 1 + 2^-8 then ties to even = 1 (one rounding of y0 + v would give 1 + 2^-7).
  const DType dt = DType::bf16;
  const V32 map = {0, 0}, ranks = {2};
  const Buf u = vals(DType::f32, {1.0f + std::ldexp(1.0f, -9), 1.0f, std::ldexp(1.0f, -8), std::ldexp(1.0f, -16)});
  const Buf B = vals(dt, {1, -1, /*row 1*/ 1, 1});
  for (int which = 0; which < 2; ++which) {
    Buf y = vals(dt, {0, 0, 1, 1});
    kernels::LoraExpandArgs a;
    a.in_dtype = DType::f32; a.dtype = dt; a.num_tokens = 2; a.x = u.data(); a.lora_b[0] = B.data();
    a.slice_width[0] = 2; a.max_loras = 1; a.max_rank = 2; a.lora_ranks = ranks.data();
    a.meta.token_lora_mapping = map.data(); a.y = y.data(); a.y_row_stride = 2;
    which ? ref::naive::lora_expand(a) : ref::lora_expand(a);
    EXPECT_EQ(y.get(0), 0.0f) << "naive=" << which;
    EXPECT_EQ(y.get(3), 1.0f) << "naive=" << which;
  }
}

// ---------------------------------------------------------------- validation

TEST(Validation, BadArgumentsThrowUsage) {
  Case c = cases()[3];
  Problem p(c, DType::bf16, DType::f32, 0.0f);
  Buf y(DType::f32, size_t(p.S) * c.T * c.r);
  auto expect_usage = [](auto&& fn, const char* what) {
    try {
      fn();
      ADD_FAILURE() << what << ": no throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::usage) << what;
    }
  };
  for (int which = 0; which < 2; ++which) {
    auto shrink = [&](kernels::LoraShrinkArgs a) {
      which ? ref::naive::lora_shrink(a) : ref::lora_shrink(a);
    };
    auto expand = [&](kernels::LoraExpandArgs a) {
      which ? ref::naive::lora_expand(a) : ref::lora_expand(a);
    };
    auto a = p.shrink(y.data(), DType::f32);
    a.num_slices = 0;
    expect_usage([&] { shrink(a); }, "num_slices 0");
    a.num_slices = kernels::kMaxSlices + 1;
    expect_usage([&] { shrink(a); }, "num_slices 9");
    a = p.shrink(y.data(), DType::f32);
    a.num_tokens = -1;
    expect_usage([&] { shrink(a); }, "negative T");
    a = p.shrink(y.data(), DType::f32);
    a.hidden = -4;
    expect_usage([&] { shrink(a); }, "negative K");
    V32 bad_map = p.map;
    bad_map[1] = c.L;
    a = p.shrink(y.data(), DType::f32);
    a.meta.token_lora_mapping = bad_map.data();
    expect_usage([&] { shrink(a); }, "slot == L");
    bad_map[1] = -2;
    expect_usage([&] { shrink(a); }, "slot -2");
    V32 bad_ranks = c.ranks;
    bad_ranks[0] = c.r + 1;
    a = p.shrink(y.data(), DType::f32);
    a.lora_ranks = bad_ranks.data();
    expect_usage([&] { shrink(a); }, "rank > max_rank");
    Buf yy = p.y0;
    auto e = p.expand(yy.data(), true);
    e.slice_width[1] = -1;
    expect_usage([&] { expand(e); }, "negative width");
    e = p.expand(yy.data(), true);
    e.num_slices = 0;
    expect_usage([&] { expand(e); }, "expand num_slices 0");
    e = p.expand(yy.data(), true);
    e.lora_ranks = bad_ranks.data();
    expect_usage([&] { expand(e); }, "expand rank > max_rank");
  }
  Buf yy = p.y0;
  auto e = p.expand(yy.data(), true);
  e.y_row_stride = p.width - 1;
  expect_usage([&] { ref::lora_expand(e); }, "y stride too small");
}

// ---------------------------------------------------------------- model-sized timing

TEST(ModelSized, MillisecondsAndMatchesNaive) {
  // Llama-3-8B-like qkv: K=4096, slices 4096/1024/1024, T=64, r=16, L=8; logits vocab 32000.
  using clock = std::chrono::steady_clock;
  Case c{"model", 64, 4096, 8, 16, {4096, 1024, 1024}, {16, 16, 8, 16, 16, 4, 16, 16}, 300};
  Problem p(c, DType::bf16, DType::f32, 0.0f);
  Buf ye = p.y0, yn = p.y0;
  auto t0 = clock::now();
  ref::add_lora_linear(p.linear(ye.data(), true));
  auto t1 = clock::now();
  ref::naive::add_lora_linear(p.linear(yn.data(), true));
  const double ms_lin = std::chrono::duration<double, std::milli>(t1 - t0).count();
  EXPECT_TRUE(close(ye, yn, rtol_of(DType::bf16)));

  Case lc{"logits", 64, 4096, 8, 16, {32000}, {16, 16, 8, 16, 16, 4, 16, 16}, 301};
  Problem q(lc, DType::bf16, DType::f32, 0.0f);
  Buf ge = q.y0, gn = q.y0;
  t0 = clock::now();
  ref::add_lora_logits(q.logits(ge.data()));
  t1 = clock::now();
  ref::naive::add_lora_logits(q.logits(gn.data()));
  const double ms_log = std::chrono::duration<double, std::milli>(t1 - t0).count();
  EXPECT_TRUE(close(ge, gn, rtol_of(DType::bf16)));
  std::printf("[ model ] add_lora_linear T=64 K=4096 S=3 L=8 r=16: %.2f ms; add_lora_logits V=32000: %.2f ms\n",
              ms_lin, ms_log);
  // Generous bounds (shared CI machines); typical values are a few ms.
  EXPECT_LT(ms_lin, 500.0);
  EXPECT_LT(ms_log, 1000.0);
}

}  // namespace
