// vLLM's TP LoRA layers (SPEC §5) as Problems of op "layer" (see layers.h). Per rank rho of a TP
// group of size tp:
//  column family, plain (§5.2-5.5): y_rho = W_rho x + b_rho, then add_lora_linear with A full and
//    B sliced like the base rows (merged: per slice; qkv: q block rho, k/v block kv_id).
//  column family, fully sharded (§5.7 _mcp_apply): shrink with A sliced along the rank into fp32
//    [S,T,r/tp]; all_gather along the last dim -> [S,T,r]; expand with B_rho (add_inputs).
//  row, plain (§5.6): y_rho = W_rho x_rho + B (A_rho x_rho); all_reduce(y) in the dtype; + b.
//  row, fully sharded: shrink A_rho x_rho -> fp32 [T,r]; all_reduce fp32; expand with the rows
//    [rho*N/tp, (rho+1)*N/tp) of B at offset rho*N/tp; then the base all_reduce and + b.
//  vocab embedding (§3.4): masked lookup of the rank's vocab rows + all_reduce, then
//    add_lora_embedding with unsharded A/B.
//  logits (§3.5): vocab-sharded lm_head GEMM, all_gather to the full vocab, add_lora_logits with
//    the request-level mapping on the full vocabulary.
// Every rank generates only its shard, from the counter hash at GLOBAL indices, so a shard equals
// the slice of the full tensor. The reference regenerates the unsharded tensors from the same hash
// and computes the rank's expected output with fp64 loops (for both --backend cpu and cuda; the
// Eigen ops are not involved, so it is independent of the code under test).
#include "apps/punica-bench/layers/layers.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include "apps/punica-bench/dist.h"
#include "apps/punica-bench/ops/exec.h"
#include "apps/punica-bench/ops/op_kit.h"
#include "kernels/common/error.h"
#include "kernels/common/hash_rng.h"

namespace punica::bench {
namespace layers {

QkvShard qkv_shard(int nh, int nkv, int hd, int tp, int rho) {
  QkvShard q;
  q.q_total = int64_t(nh) * hd;
  q.kv_total = int64_t(nkv) * hd;
  q.q_sh = int64_t(nh / tp) * hd;
  q.kv_sh = int64_t(std::max(1, nkv / tp)) * hd;
  q.rep = std::max(1, tp / nkv);
  q.q_id = rho;
  q.kv_id = rho / q.rep;
  return q;
}

int shard_true_rank(int true_rank, int max_rank, int tp, int rho) {
  const int rs = max_rank / tp;
  return std::clamp(true_rank - rho * rs, 0, rs);
}

ColumnPlan column_plan(const Case& c, int tp, int rho) {
  ColumnPlan p;
  const std::string& l = c.layer;
  for (auto n : c.slices) p.packed_rows += n;
  auto block = [](ColumnSlice& s, int64_t b0, int64_t w0, int64_t n) {
    for (int64_t j = 0; j < n; ++j) { s.b_rows.push_back(b0 + j); s.w_rows.push_back(w0 + j); }
  };
  if (l == "replicated" || l == "column") {
    if (l == "replicated") { tp = 1; rho = 0; }
    const int64_t N = c.slices.at(0), n = N / tp;
    p.lora_rows = {N};
    ColumnSlice s;
    block(s, rho * n, rho * n, n);
    p.slices.push_back(std::move(s));
  } else if (l == "merged_column") {
    int64_t off = 0;
    for (std::size_t i = 0; i < c.slices.size(); ++i) {
      const int64_t o = c.slices[i], n = o / tp;
      p.lora_rows.push_back(o);
      ColumnSlice s;
      s.lora = int(i);
      block(s, rho * n, off + rho * n, n);
      p.slices.push_back(std::move(s));
      off += o;
    }
  } else if (l == "qkv" || l == "merged_qkv") {
    const QkvShard q = qkv_shard(c.num_heads, c.num_kv_heads, c.head_dim, tp, rho);
    const int64_t Q = q.q_total, KV = q.kv_total;
    if (l == "qkv") {  // one LoRA over the packed q|k|v rows: B rows = base rows
      p.lora_rows = {Q + 2 * KV};
      ColumnSlice s;
      block(s, q.q_id * q.q_sh, q.q_id * q.q_sh, q.q_sh);
      block(s, Q + q.kv_id * q.kv_sh, Q + q.kv_id * q.kv_sh, q.kv_sh);
      block(s, Q + KV + q.kv_id * q.kv_sh, Q + KV + q.kv_id * q.kv_sh, q.kv_sh);
      p.slices.push_back(std::move(s));
    } else {  // three LoRAs; output_ids = (rho, kv_id, kv_id)
      p.lora_rows = {Q, KV, KV};
      ColumnSlice sq, sk, sv;
      sq.lora = 0; sk.lora = 1; sv.lora = 2;
      block(sq, q.q_id * q.q_sh, q.q_id * q.q_sh, q.q_sh);
      block(sk, q.kv_id * q.kv_sh, Q + q.kv_id * q.kv_sh, q.kv_sh);
      block(sv, q.kv_id * q.kv_sh, Q + KV + q.kv_id * q.kv_sh, q.kv_sh);
      p.slices = {std::move(sq), std::move(sk), std::move(sv)};
    }
  } else {
    fail(ErrorKind::usage, "column_plan: layer '" + l + "' is not a column-family layer");
  }
  return p;
}

std::vector<ExpectedColumn> vllm_expected_columns(const Case& c, int tp, int rho) {
  // Written apart from column_plan, from vLLM's rules per output row, so that a wrong mapping in the
  // layer (the plan it shards and launches with) fails the scenario check instead of agreeing with it.
  std::vector<ExpectedColumn> out;
  const std::string& l = c.layer;
  if (l == "replicated") { tp = 1; rho = 0; }
  if (l == "qkv" || l == "merged_qkv") {
    // QKVParallelLinear: rank rho owns q heads [rho nh/tp, (rho+1) nh/tp) and max(1, nkv/tp) kv heads
    // from head floor(rho nkv / tp) (kv heads replicated over tp/nkv ranks when tp > nkv).
    const int64_t d = c.head_dim, q_all = int64_t(c.num_heads) * d, kv_all = int64_t(c.num_kv_heads) * d;
    const int q_heads = c.num_heads / tp, kv_heads = std::max(1, c.num_kv_heads / tp);
    const int kv_first = int(int64_t(rho) * c.num_kv_heads / tp);
    const bool one_lora = l == "qkv";
    for (int h = rho * q_heads; h < (rho + 1) * q_heads; ++h)
      for (int64_t e = 0; e < d; ++e) out.push_back({0, h * d + e, h * d + e});
    for (int part = 1; part <= 2; ++part)  // k, then v
      for (int h = kv_first; h < kv_first + kv_heads; ++h)
        for (int64_t e = 0; e < d; ++e) {
          const int64_t packed = q_all + (part - 1) * kv_all + h * d + e;
          out.push_back({one_lora ? 0 : part, one_lora ? packed : h * d + e, packed});
        }
    return out;
  }
  // Column / MergedColumnParallelLinear: each output (slice) split evenly, rank rho's block of each.
  int64_t packed0 = 0;
  for (std::size_t s = 0; s < c.slices.size(); ++s) {
    const int64_t n = c.slices[s] / tp;
    for (int64_t i = rho * n; i < (rho + 1) * n; ++i) out.push_back({int(s), i, packed0 + i});
    packed0 += c.slices[s];
  }
  return out;
}

// Runs fn(begin, end) over [0, n) on several threads (the host reference of big GPU cases, where
// regenerating the full weights from the hash dominates: a 2-rank run on the 32-core 2xH200 machine
// took ~5 s per Llama-3-70B gate_up case with 4 threads); one thread on small machines, where
// mpirun already oversubscribes the cores.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t th = std::clamp<int64_t>(int64_t(std::thread::hardware_concurrency()) / 2, 1, 16);
  if (th == 1 || n < 64) { fn(0, n); return; }
  std::vector<std::thread> ts;
  const int64_t chunk = (n + th - 1) / th;
  for (int64_t b = 0; b < n; b += chunk) ts.emplace_back(fn, b, std::min(n, b + chunk));
  for (auto& t : ts) t.join();
}

// fp64 dot product of fp32 vectors (four partial sums: the reference of big cases stays fast).
double dot(const float* a, const float* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    s0 += double(a[k]) * double(b[k]);
    s1 += double(a[k + 1]) * double(b[k + 1]);
    s2 += double(a[k + 2]) * double(b[k + 2]);
    s3 += double(a[k + 3]) * double(b[k + 3]);
  }
  for (; k < n; ++k) s0 += double(a[k]) * double(b[k]);
  return (s0 + s1) + (s2 + s3);
}

}  // namespace layers

namespace {

using kernels::DType;
using kernels::round_to;

double base_rtol(DType t) { return t == DType::f32 ? 1e-5 : t == DType::f16 ? 5e-3 : 1e-2; }
using kernels::nan_bits;

using layers::dot;
using layers::parallel_for;

// The inputs' generator (op_kit.h's HashValues, the one the op entries' Builder uses), rounded to
// the dtype as stored, evaluated at GLOBAL indices so that a shard equals the slice of the full tensor.
class Gen {
 public:
  Gen(const Case& c, const ProblemOptions& o) : h_(c, o), dt_(c.dtype) {}
  uint64_t key(const std::string& name) const { return h_.key(name); }
  float value(uint64_t k, uint64_t i, float scale) const { return round_to(dt_, h_.value(k, i, scale)); }
  float stacked(uint64_t k, uint64_t i, float scale, int rank_index, int slot_rank, bool none) const {
    if (rank_index >= slot_rank || none) return h_.stacked(k, i, scale, rank_index, slot_rank, none);
    return value(k, i, scale);
  }
  bool nan_padding() const { return h_.nan_padding(); }

 private:
  HashValues h_;
  DType dt_;
};

// Indices of the LoRAKernelMeta tensors (scratch; computed by prepare(), as vLLM does once per
// batch in update_metadata, outside the layer forward).
using Meta = MetaTensors;

// Shared state and tensor helpers of every layer problem.
class LayerProblem : public Problem {
 public:
  // Layer composites widen the op tolerance by 2 (DESIGN §6 allows a documented factor): the base
  // output is rounded to 16 bits before the LoRA delta is added, as in vLLM, so when base and
  // delta nearly cancel, a 1-ulp rounding difference of the (larger) base shows up relative to a
  // small result. Seen on the H200: 2 of 917504 elements of a Llama-3-70B gate_up layer at 4 ulps.
  double rtol() const override { return 2.0 * base_rtol(dtype); }

 public:
  LayerProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o, int tp_rank, bool request_level)
      : c_(c), g_(c, o), tp_(std::max(1, c.tp)), rho_(tp_rank) {
    dtype = c.dtype;
    es_ = kernels::dtype_size(dtype);
    L_ = c.max_loras;
    r_ = c.max_rank;
    slot_rank_ = lay.slot_rank;
    map_ = request_level ? lay.request_slot : lay.token_slot;
    T_ = int64_t(map_.size());
    ranks_ = ints("lora_ranks", slot_rank_);
    Builder b(c, o, tensors);  // the op entries' LoRAKernelMeta tensors (op_kit.h)
    meta_ = add_meta(b, map_, L_, /*as_outputs=*/false, meta_ws_bytes(T_, L_));
    mapping_tensor = meta_.mapping;
    for (int32_t s : map_)
      if (s >= 0) {
        tokens_rank_ += slot_rank_[std::size_t(s)];
        ++lora_T_;
      }
    std::vector<char> used(std::size_t(std::max(L_, 0)), 0);
    for (int32_t s : map_) if (s >= 0) used[std::size_t(s)] = 1;
    for (int l = 0; l < L_; ++l)
      if (used[std::size_t(l)]) { active_.push_back(l); sum_active_rank_ += slot_rank_[std::size_t(l)]; }
  }

  void prepare(Backend& be, const std::vector<void*>& p) override { run_op(be, meta_.args(p)); }
  void run(Backend& be, const std::vector<void*>& p) override {
    base(be, p);
    lora(be, p);
  }
  std::string describe() const override {
    return "layer " + c_.layer + (c_.fully_sharded ? " (fully sharded)" : "") + " tp " + std::to_string(tp_) +
           " rank " + std::to_string(rho_) + ", T " + std::to_string(T_);
  }

 protected:
  // The base layer's forward (with its own collective) and the LoRA part (with its collectives).
  virtual void base(Backend& be, const std::vector<void*>& p) = 0;
  virtual void lora(Backend& be, const std::vector<void*>& p) = 0;

  int add(HostTensor t) { tensors.push_back(std::move(t)); return int(tensors.size()) - 1; }
  // A tensor whose local flat element i holds fn(i) (already rounded to dt by Gen).
  int dense(const std::string& name, DType dt, std::vector<int64_t> shape, const std::function<float(std::size_t)>& fn) {
    HostTensor t;
    t.name = name; t.dtype = dt; t.shape = std::move(shape); t.role = Role::input;
    t.data.resize(t.bytes());
    parallel_for(int64_t(t.numel()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) kernels::store_elem(t.data.data(), dt, std::size_t(i), fn(std::size_t(i)));
    });
    return add(std::move(t));
  }
  int ints(const std::string& name, const std::vector<int32_t>& v) {
    HostTensor t;
    t.name = name; t.is_int = true; t.shape = {int64_t(v.size())}; t.role = Role::input;
    t.data.resize(v.size() * 4);
    if (!v.empty()) std::memcpy(t.data.data(), v.data(), v.size() * 4);
    return add(std::move(t));
  }
  int scratch(const std::string& name, std::size_t bytes) {
    HostTensor t;
    t.name = name; t.role = Role::scratch; t.scratch_bytes = std::max<std::size_t>(bytes, 16); t.is_int = true;
    t.shape = {int64_t((t.scratch_bytes + 3) / 4)};
    return add(std::move(t));
  }
  // Write-only output [rows, cols] poisoned with NaN: every element must be written.
  int output(const std::string& name, int64_t rows, int64_t cols) {
    HostTensor t;
    t.name = name; t.dtype = dtype; t.shape = {rows, cols}; t.role = Role::output;
    t.data.resize(t.bytes());
    for (std::size_t e = 0; e < t.numel(); ++e)
      if (dtype == DType::f32) reinterpret_cast<uint32_t*>(t.data.data())[e] = nan_bits(dtype);
      else reinterpret_cast<uint16_t*>(t.data.data())[e] = uint16_t(nan_bits(dtype));
    t.rows = rows; t.inner = cols;
    t.must_keep.assign(t.numel(), 0);
    return add(std::move(t));
  }
  // Stacked adapter shard [L, d1, d2] (d1, d2 local); glob(l, i, j) gives the global flat index and
  // the global rank index of local element (l, i, j).
  struct GlobalIdx { uint64_t flat; int rank_index; };
  int stacked(const std::string& local_name, const std::string& global_name, int64_t d1, int64_t d2, float scale,
              bool none, const std::function<GlobalIdx(int, int64_t, int64_t)>& glob) {
    const uint64_t k = g_.key(global_name);
    HostTensor t;
    t.name = local_name; t.dtype = dtype; t.shape = {L_, d1, d2}; t.role = Role::input;
    t.data.resize(t.bytes());
    parallel_for(int64_t(L_) * d1, [&](int64_t b, int64_t e) {
      for (int64_t li = b; li < e; ++li) {
        const int l = int(li / d1);
        const int64_t i = li % d1;
        for (int64_t j = 0; j < d2; ++j) {
          GlobalIdx gi = glob(l, i, j);
          std::size_t idx = (std::size_t(l) * std::size_t(d1) + std::size_t(i)) * std::size_t(d2) + std::size_t(j);
          kernels::store_elem(t.data.data(), dtype, idx, g_.stacked(k, gi.flat, scale, gi.rank_index, slot_rank_[std::size_t(l)], none));
        }
      }
    });
    return add(std::move(t));
  }
  bool is_none(int sub_lora) const {
    return std::find(c_.none_slices.begin(), c_.none_slices.end(), sub_lora) != c_.none_slices.end();
  }
  const int32_t* ranks(const std::vector<void*>& p) const { return static_cast<const int32_t*>(p[ranks_]); }

  // ---- reference helpers ----
  std::vector<int64_t> ref_rows() const {
    std::vector<int64_t> rows;
    for (int64_t t = 0; t < T_; ++t)
      if (row_sample.empty() || (std::size_t(t) < row_sample.size() && row_sample[std::size_t(t)])) rows.push_back(t);
    return rows;
  }
  // Full rows of a [rows_total, K] tensor `name` (scale) for the given row indices.
  std::vector<float> gen_rows(const std::string& name, const std::vector<int64_t>& rows, int64_t K, float scale) const {
    const uint64_t k = g_.key(name);
    std::vector<float> v(rows.size() * std::size_t(K));
    for (std::size_t i = 0; i < rows.size(); ++i)
      for (int64_t j = 0; j < K; ++j) v[i * std::size_t(K) + std::size_t(j)] = g_.value(k, uint64_t(rows[i] * K + j), scale);
    return v;
  }
  // u[i][j] = round(A[slot][j] . x_i) over the FULL A [L, r, K] of `name`, j < true rank (the
  // intermediate the ops round to the weight dtype before the expand). Empty for slot -1.
  std::vector<std::vector<float>> ref_shrink(const std::string& name, bool none, const std::vector<int64_t>& rows,
                                             const std::vector<float>& x, int64_t K) const {
    const uint64_t k = g_.key(name);
    const float scale = 1.0f / std::sqrt(float(K));
    std::vector<std::vector<float>> A(static_cast<std::size_t>(L_));  // generated on first use
    std::vector<std::vector<float>> u(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const int s = map_[std::size_t(rows[i])];
      if (s < 0) continue;
      const int ra = slot_rank_[std::size_t(s)];
      auto& a = A[std::size_t(s)];
      if (a.empty()) {
        a.resize(std::size_t(ra) * std::size_t(K));
        for (int j = 0; j < ra; ++j)
          for (int64_t q = 0; q < K; ++q)
            a[std::size_t(j) * std::size_t(K) + std::size_t(q)] =
                g_.stacked(k, uint64_t((int64_t(s) * r_ + j) * K + q), scale, j, ra, none);
      }
      u[i].resize(std::size_t(ra));
      const float* xi = x.data() + i * std::size_t(K);
      for (int j = 0; j < ra; ++j) {
        const double acc = dot(xi, a.data() + std::size_t(j) * std::size_t(K), K);
        u[i][std::size_t(j)] = round_to(dtype, float(acc));
      }
    }
    return u;
  }
  // Rounded LoRA delta of row i at full B row `brow` of `name` ([L, N_lora, r]).
  float ref_delta(uint64_t bkey, bool none, int64_t N_lora, int64_t brow, int slot, const std::vector<float>& u) const {
    const float scale = 1.0f / std::sqrt(float(std::max(1, r_)));
    const int ra = slot_rank_[std::size_t(slot)];
    double acc = 0;
    for (int j = 0; j < ra; ++j)
      acc += double(u[std::size_t(j)]) *
             double(g_.stacked(bkey, uint64_t((int64_t(slot) * N_lora + brow) * r_ + j), scale, j, ra, none));
    return round_to(dtype, float(acc));
  }

  // ---- work (DESIGN §7 add_lora_linear formula on this rank's shard) ----
  double lora_linear_bytes(int S, double a_rank_sum_per_slice, int64_t K, double sumN) const {
    return double(S) * a_rank_sum_per_slice * double(K) * double(es_) + double(lora_T_) * double(K) * double(es_) +
           double(sum_active_rank_) * sumN * double(es_) + 2.0 * double(lora_T_) * sumN * double(es_);
  }
  std::vector<Backend::Group> lora_groups(int64_t n, int64_t k, bool rank_is_n) const {
    std::vector<Backend::Group> gs;
    for (int l : active_) {
      int64_t cnt = 0;
      for (int32_t s : map_) cnt += s == l;
      int64_t ra = slot_rank_[std::size_t(l)];
      gs.push_back(rank_is_n ? Backend::Group{cnt, n * ra, k} : Backend::Group{cnt, n, ra});
    }
    return gs;
  }

  Case c_;
  Gen g_;
  int tp_, rho_;
  std::size_t es_ = 2;
  int L_ = 0, r_ = 0;
  int64_t T_ = 0;
  std::vector<int32_t> slot_rank_, map_;
  std::vector<int> active_;
  double tokens_rank_ = 0, sum_active_rank_ = 0;
  int64_t lora_T_ = 0;  // rows with an adapter: the only x / y rows the LoRA part must move
  int ranks_ = -1;
  Meta meta_;
};

// ------------------------------------------------------------------------------------------------
// Replicated / Column / MergedColumn / QKV / MergedQKV, plain and fully sharded.
class ColumnLayer final : public LayerProblem {
 public:
  ColumnLayer(const Case& c, const BatchLayout& lay, const ProblemOptions& o, int rho)
      : LayerProblem(c, lay, o, c.layer == "replicated" ? 0 : rho, false) {
    if (c.layer == "replicated") tp_ = 1;  // vLLM forces tp = 1: every rank computes the full y
    fs_ = c.fully_sharded && c.layer != "replicated";
    plan_ = layers::column_plan(c, tp_, rho_);
    K_ = c.hidden;
    N_ = plan_.local_width();
    S_ = int(plan_.slices.size());
    PUNICA_REQUIRE(S_ <= kernels::kMaxSlices, ErrorKind::usage, "layer: more than kMaxSlices slices");
    rs_ = fs_ ? r_ / tp_ : r_;
    const float ws = 1.0f / std::sqrt(float(K_)), as = ws, bs = 1.0f / std::sqrt(float(std::max(1, r_)));
    const uint64_t kx = g_.key("x"), kw = g_.key("weight"), kb = g_.key("bias");
    x_ = dense("x", dtype, {T_, K_}, [&](std::size_t i) { return g_.value(kx, i, 1.0f); });
    w_ = dense("weight.rank", dtype, {N_, K_}, [&](std::size_t i) {
      int64_t c2 = int64_t(i) / K_, k = int64_t(i) % K_;
      return g_.value(kw, uint64_t(col_w_row(c2) * K_ + k), ws);
    });
    bias_ = dense("bias.rank", dtype, {N_}, [&](std::size_t i) { return g_.value(kb, uint64_t(col_w_row(int64_t(i))), 0.5f); });
    for (int s = 0; s < S_; ++s) {
      const auto& sl = plan_.slices[std::size_t(s)];
      const std::string an = "lora_a." + std::to_string(sl.lora), bn = "lora_b." + std::to_string(sl.lora);
      const bool none = is_none(sl.lora);
      const int64_t Nl = plan_.lora_rows[std::size_t(sl.lora)];
      // A: full [L, r, K]; fully sharded: rows [rho*r/tp, (rho+1)*r/tp) -> [L, r/tp, K].
      const int64_t j0 = fs_ ? int64_t(rho_) * rs_ : 0;
      a_[s] = stacked(an + ".rank", an, rs_, K_, as, none, [&](int l, int64_t j, int64_t k) {
        int64_t jg = j0 + j;
        return GlobalIdx{uint64_t((int64_t(l) * r_ + jg) * K_ + k), int(jg)};
      });
      // B: rows of the full [L, N_lora, r] like the base rows.
      b_[s] = stacked(bn + ".rank", bn, sl.width(), r_, bs, none, [&](int l, int64_t i, int64_t j) {
        return GlobalIdx{uint64_t((int64_t(l) * Nl + sl.b_rows[std::size_t(i)]) * r_ + j), int(j)};
      });
    }
    y_ = output("y", T_, N_);
    if (fs_) {
      std::vector<int32_t> sr(slot_rank_.size());
      for (std::size_t l = 0; l < sr.size(); ++l) {
        sr[l] = layers::shard_true_rank(slot_rank_[l], r_, tp_, rho_);
        shard_rank_sum_ += active_has(int(l)) ? sr[l] : 0;
      }
      shard_ranks_ = ints("lora_ranks.shard", sr);
      const std::size_t part = std::size_t(S_) * std::size_t(T_) * std::size_t(rs_);
      buf_ = scratch("shrink_shard_f32", part * 4);
      gathered_ = scratch("shrink_gathered_f32", part * std::size_t(tp_) * 4);
      tmp_ = scratch("gather_tmp_f32", part * std::size_t(tp_) * 4);
    } else {
      ws_ = scratch("workspace", kernels::add_lora_linear_workspace_bytes(std::max<int64_t>(T_, 1), S_, r_));
    }
  }

  void reference(const std::vector<void*>& p, bool) override {
    const auto rows = ref_rows();
    const auto X = gen_rows("x", rows, K_, 1.0f);
    // Each local column's expectation from vLLM's rules, not from the layer's own plan_ (a wrong
    // shard mapping in the layer then fails the check). Full sub-LoRA widths likewise from the case.
    const std::vector<layers::ExpectedColumn> expect = layers::vllm_expected_columns(c_, tp_, rho_);
    void* y = p[y_];
    if (int64_t(expect.size()) != N_) {  // the layer's output width is wrong: every element fails
      for (std::size_t i = 0; i < rows.size(); ++i)
        for (int64_t c = 0; c < N_; ++c) kernels::store_elem(y, dtype, std::size_t(rows[i] * N_ + c), std::nanf(""));
      return;
    }
    std::vector<int64_t> lora_width = c_.slices;  // merged: one sub-LoRA per slice
    if (c_.layer == "qkv" || c_.layer == "replicated" || c_.layer == "column") {
      int64_t all = 0;
      for (auto n : c_.slices) all += n;
      lora_width = {all};
    }
    // The shrink of each sub-LoRA the expected columns use, once.
    std::vector<std::vector<std::vector<float>>> U(lora_width.size());
    for (const auto& e : expect)
      if (U[std::size_t(e.lora)].empty())
        U[std::size_t(e.lora)] = ref_shrink("lora_a." + std::to_string(e.lora), is_none(e.lora), rows, X, K_);
    const uint64_t kw = g_.key("weight"), kb = g_.key("bias");
    const float ws = 1.0f / std::sqrt(float(K_));
    parallel_for(N_, [&](int64_t c0, int64_t c1) {
      std::vector<float> w(static_cast<std::size_t>(K_));
      for (int64_t c = c0; c < c1; ++c) {
        const layers::ExpectedColumn& e = expect[std::size_t(c)];
        const int64_t wrow = e.w_row;
        for (int64_t k = 0; k < K_; ++k) w[std::size_t(k)] = g_.value(kw, uint64_t(wrow * K_ + k), ws);
        const float b = g_.value(kb, uint64_t(wrow), 0.5f);
        const uint64_t bkey = g_.key("lora_b." + std::to_string(e.lora));
        const int64_t Nl = lora_width[std::size_t(e.lora)];
        for (std::size_t i = 0; i < rows.size(); ++i) {
          const float* xi = X.data() + i * std::size_t(K_);
          double acc = dot(xi, w.data(), K_);
          float v = round_to(dtype, round_to(dtype, float(acc)) + b);  // base GEMM, then its bias
          const int slot = map_[std::size_t(rows[i])];
          if (slot >= 0)
            v = round_to(dtype, v + ref_delta(bkey, is_none(e.lora), Nl, e.b_row, slot, U[std::size_t(e.lora)][i]));
          kernels::store_elem(y, dtype, std::size_t(rows[i] * N_ + c), v);
        }
      }
    });
  }

  Work work() const override {
    Work w;
    w.tokens = T_;
    double sumN = double(N_);
    if (!fs_) {
      w.bytes = lora_linear_bytes(S_, sum_active_rank_, K_, sumN);
    } else {  // A shard reads at the shard's true ranks + the fp32 shard written, gathered buffer read
      w.bytes = lora_linear_bytes(S_, shard_rank_sum_, K_, sumN) + double(S_) * double(lora_T_) * double(rs_) * 4 +
                double(S_) * double(lora_T_) * double(r_) * 4;
    }
    w.flops = 2.0 * tokens_rank_ * (double(S_) * double(K_) / (fs_ ? tp_ : 1) + sumN);
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({T_, N_, K_, false});         // the base GEMM writes y
    bl.dense.push_back({T_, int64_t(S_) * r_, K_, false});
    bl.dense.push_back({T_, N_, r_, true});          // the LoRA delta adds into y
    bl.grouped.push_back({lora_groups(S_, K_, true), false});
    bl.grouped.push_back({lora_groups(N_, 0, false), true});
    return bl;
  }
  std::vector<Part> parts() override {
    std::vector<Part> v = {{"base", [this](Backend& be, const std::vector<void*>& p) { base(be, p); }},
                           {"lora", [this](Backend& be, const std::vector<void*>& p) { lora(be, p); }}};
    if (fs_ && tp_ > 1) v.push_back({"comm_all_gather", [this](Backend& be, const std::vector<void*>& p) { gather(be, p); }});
    return v;
  }
  std::vector<Comm> comms() const override {
    if (!fs_ || tp_ == 1) return {};
    return {{"all_gather", double(S_) * double(T_) * double(r_) * 4, tp_, "comm_all_gather"}};
  }

 protected:
  void base(Backend& be, const std::vector<void*>& p) override {
    LinearArgs la;
    la.dtype = dtype; la.m = T_; la.n = N_; la.k = K_; la.x = p[x_]; la.w = p[w_]; la.y = p[y_]; la.ldy = N_;
    be.base_linear(la);
    be.add_bias(p[y_], p[bias_], dtype, T_, N_, N_);
  }
  void lora(Backend& be, const std::vector<void*>& p) override {
    if (!fs_) {
      kernels::AddLoraLinearArgs a;
      a.dtype = dtype; a.num_tokens = T_; a.hidden = K_; a.x = p[x_]; a.x_row_stride = K_; a.num_slices = S_;
      for (int s = 0; s < S_; ++s) {
        a.lora_a[s] = p[a_[s]]; a.lora_b[s] = p[b_[s]]; a.slice_width[s] = plan_.slices[std::size_t(s)].width();
      }
      a.max_loras = L_; a.max_rank = r_; a.lora_ranks = ranks(p); a.meta = meta_.view(p);
      a.scale = 1.0f;  // vLLM folds the scaling into B: layers call the ops with 1.0 (SPEC §1.1)
      a.y = p[y_]; a.y_row_stride = N_; a.add_inputs = true; a.workspace = p[ws_];
      run_op(be, a);
      return;
    }
    // _mcp_apply: shrink with the rank's A rows (no zero-fill needed: shrink overwrites the buffer,
    // and with no_lora_flag the expand skips every token), gather along the rank dim, expand.
    kernels::LoraShrinkArgs s;
    s.dtype = dtype; s.out_dtype = DType::f32; s.num_tokens = T_; s.hidden = K_; s.x = p[x_]; s.x_row_stride = K_;
    s.num_slices = S_;
    for (int i = 0; i < S_; ++i) s.lora_a[i] = p[a_[i]];
    s.max_loras = L_; s.max_rank = rs_; s.lora_ranks = static_cast<const int32_t*>(p[shard_ranks_]);
    s.meta = meta_.view(p); s.scale = 1.0f; s.y = p[buf_];
    run_op(be, s);
    gather(be, p);
    kernels::LoraExpandArgs e;
    e.in_dtype = DType::f32; e.dtype = dtype; e.num_tokens = T_; e.x = p[gathered_]; e.num_slices = S_;
    for (int i = 0; i < S_; ++i) { e.lora_b[i] = p[b_[i]]; e.slice_width[i] = plan_.slices[std::size_t(i)].width(); }
    e.max_loras = L_; e.max_rank = r_; e.lora_ranks = ranks(p); e.meta = meta_.view(p);
    e.y = p[y_]; e.y_row_stride = N_; e.offset_start = 0; e.add_inputs = true;
    run_op(be, e);
  }

 private:
  void gather(Backend& be, const std::vector<void*>& p) {
    be.all_gather_last_dim_f32(static_cast<const float*>(p[buf_]), static_cast<float*>(p[gathered_]),
                               static_cast<float*>(p[tmp_]), int64_t(S_) * T_, rs_, tp_);
  }
  int64_t col_w_row(int64_t c) const {
    for (auto& sl : plan_.slices) {
      if (c < sl.width()) return sl.w_rows[std::size_t(c)];
      c -= sl.width();
    }
    return -1;
  }
  bool active_has(int l) const { return std::find(active_.begin(), active_.end(), l) != active_.end(); }

  layers::ColumnPlan plan_;
  bool fs_ = false;
  int S_ = 1, rs_ = 0;
  int64_t K_ = 0, N_ = 0;
  double shard_rank_sum_ = 0;
  int x_ = -1, w_ = -1, bias_ = -1, y_ = -1, ws_ = -1, shard_ranks_ = -1, buf_ = -1, gathered_ = -1, tmp_ = -1;
  int a_[kernels::kMaxSlices] = {}, b_[kernels::kMaxSlices] = {};
};

// ------------------------------------------------------------------------------------------------
// RowParallelLinearWithLoRA (plain) and RowParallelLinearWithShardedLoRA.
class RowLayer final : public LayerProblem {
 public:
  RowLayer(const Case& c, const BatchLayout& lay, const ProblemOptions& o, int rho)
      : LayerProblem(c, lay, o, rho, false) {
    fs_ = c.fully_sharded;
    K_ = c.hidden;
    N_ = c.slices.at(0);
    kl_ = K_ / tp_;
    nl_ = fs_ ? N_ / tp_ : N_;
    const int64_t k0 = int64_t(rho_) * kl_, n0 = fs_ ? int64_t(rho_) * nl_ : 0;
    const float ws = 1.0f / std::sqrt(float(K_)), bs = 1.0f / std::sqrt(float(std::max(1, r_)));
    const uint64_t kx = g_.key("x"), kw = g_.key("weight"), kb = g_.key("bias");
    // x_rho = columns [rho*K/tp, (rho+1)*K/tp) of the full input (input_is_parallel).
    x_ = dense("x.rank", dtype, {T_, kl_}, [&](std::size_t i) {
      int64_t t = int64_t(i) / kl_, k = int64_t(i) % kl_;
      return g_.value(kx, uint64_t(t * K_ + k0 + k), 1.0f);
    });
    w_ = dense("weight.rank", dtype, {N_, kl_}, [&](std::size_t i) {
      int64_t n = int64_t(i) / kl_, k = int64_t(i) % kl_;
      return g_.value(kw, uint64_t(n * K_ + k0 + k), ws);
    });
    bias_ = dense("bias", dtype, {N_}, [&](std::size_t i) { return g_.value(kb, i, 0.5f); });
    const bool none = is_none(0);
    a_ = stacked("lora_a.0.rank", "lora_a.0", r_, kl_, ws, none, [&](int l, int64_t j, int64_t k) {
      return GlobalIdx{uint64_t((int64_t(l) * r_ + j) * K_ + k0 + k), int(j)};
    });
    b_ = stacked("lora_b.0.rank", "lora_b.0", nl_, r_, bs, none, [&](int l, int64_t n, int64_t j) {
      return GlobalIdx{uint64_t((int64_t(l) * N_ + n0 + n) * r_ + j), int(j)};
    });
    y_ = output("y", T_, N_);
    if (fs_) buf_ = scratch("shrink_f32", std::size_t(T_) * std::size_t(r_) * 4);
    else ws_ = scratch("workspace", kernels::add_lora_linear_workspace_bytes(std::max<int64_t>(T_, 1), 1, r_));
  }

  void reference(const std::vector<void*>& p, bool) override {
    // The full y after the reduce and the bias (identical on every rank): W x + b + B (A x).
    const auto rows = ref_rows();
    const auto X = gen_rows("x", rows, K_, 1.0f);
    const auto U = ref_shrink("lora_a.0", is_none(0), rows, X, K_);
    const uint64_t kw = g_.key("weight"), kb = g_.key("bias"), bkey = g_.key("lora_b.0");
    const float ws = 1.0f / std::sqrt(float(K_));
    void* y = p[y_];
    parallel_for(N_, [&](int64_t n0, int64_t n1) {
      std::vector<float> w(static_cast<std::size_t>(K_));
      for (int64_t n = n0; n < n1; ++n) {
        for (int64_t k = 0; k < K_; ++k) w[std::size_t(k)] = g_.value(kw, uint64_t(n * K_ + k), ws);
        const float b = g_.value(kb, uint64_t(n), 0.5f);
        for (std::size_t i = 0; i < rows.size(); ++i) {
          const float* xi = X.data() + i * std::size_t(K_);
          double acc = dot(xi, w.data(), K_);
          // The tp = 1 rounding sequence (GEMM, + LoRA delta, reduce = identity, + bias); for tp > 1
          // the per-rank partials are rounded before the reduce (see rtol()).
          float v = round_to(dtype, float(acc));
          const int slot = map_[std::size_t(rows[i])];
          if (slot >= 0) v = round_to(dtype, v + ref_delta(bkey, is_none(0), N_, n, slot, U[i]));
          kernels::store_elem(y, dtype, std::size_t(rows[i] * N_ + n), round_to(dtype, v + b));
        }
      }
    });
  }
  // Each rank's 16-bit partial output is rounded before the dtype all-reduce (vLLM reduces in the
  // model dtype), and the plain layer also rounds each rank's partial LoRA delta: the sum carries
  // up to tp extra roundings of partials of the output's size. Widen rtol by 2 for tp > 1.
  double rtol() const override { return 2.0 * base_rtol(dtype) * (tp_ > 1 ? 2.0 : 1.0); }

  Work work() const override {
    Work w;
    w.tokens = T_;
    if (!fs_) w.bytes = lora_linear_bytes(1, sum_active_rank_, kl_, double(N_));
    else      // A_rho shard, x_rho, fp32 [T,r] written + read, B_rho rows, y's column block
      w.bytes = lora_linear_bytes(1, sum_active_rank_, kl_, double(nl_)) + 2.0 * double(lora_T_) * double(r_) * 4;
    w.flops = 2.0 * tokens_rank_ * (double(kl_) + double(nl_));
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({T_, N_, kl_, false});
    bl.dense.push_back({T_, r_, kl_, false});
    bl.dense.push_back({T_, nl_, r_, true});
    bl.grouped.push_back({lora_groups(1, kl_, true), false});
    bl.grouped.push_back({lora_groups(nl_, 0, false), true});
    return bl;
  }
  std::vector<Part> parts() override {
    std::vector<Part> v = {{"base", [this](Backend& be, const std::vector<void*>& p) {
                              gemm(be, p);
                              reduce_bias(be, p);
                            }},
                           {"lora", [this](Backend& be, const std::vector<void*>& p) { lora(be, p); }}};
    if (tp_ > 1) {
      v.push_back({"comm_base_all_reduce", [this](Backend& be, const std::vector<void*>& p) {
                     be.all_reduce_sum(p[y_], dtype, std::size_t(T_ * N_), tp_);
                   }});
      if (fs_)
        v.push_back({"comm_all_reduce", [this](Backend& be, const std::vector<void*>& p) {
                       be.all_reduce_sum_f32(static_cast<float*>(p[buf_]), std::size_t(T_ * r_), tp_);
                     }});
    }
    return v;
  }
  std::vector<Comm> comms() const override {
    if (tp_ == 1) return {};
    std::vector<Comm> v = {{"all_reduce", double(T_) * double(N_) * double(es_), tp_, "comm_base_all_reduce"}};
    if (fs_) v.push_back({"all_reduce", double(T_) * double(r_) * 4, tp_, "comm_all_reduce"});
    return v;
  }
  void run(Backend& be, const std::vector<void*>& p) override {
    gemm(be, p);     // partial W_rho x_rho
    lora(be, p);     // + partial (plain) or column block rho (fully sharded) LoRA
    reduce_bias(be, p);
  }

 protected:
  void base(Backend& be, const std::vector<void*>& p) override { gemm(be, p); reduce_bias(be, p); }
  void lora(Backend& be, const std::vector<void*>& p) override {
    if (!fs_) {
      kernels::AddLoraLinearArgs a;
      a.dtype = dtype; a.num_tokens = T_; a.hidden = kl_; a.x = p[x_]; a.x_row_stride = kl_; a.num_slices = 1;
      a.lora_a[0] = p[a_]; a.lora_b[0] = p[b_]; a.slice_width[0] = N_;
      a.max_loras = L_; a.max_rank = r_; a.lora_ranks = ranks(p); a.meta = meta_.view(p); a.scale = 1.0f;
      a.y = p[y_]; a.y_row_stride = N_; a.add_inputs = true; a.workspace = p[ws_];
      run_op(be, a);
      return;
    }
    kernels::LoraShrinkArgs s;
    s.dtype = dtype; s.out_dtype = DType::f32; s.num_tokens = T_; s.hidden = kl_; s.x = p[x_]; s.x_row_stride = kl_;
    s.num_slices = 1; s.lora_a[0] = p[a_]; s.max_loras = L_; s.max_rank = r_; s.lora_ranks = ranks(p);
    s.meta = meta_.view(p); s.scale = 1.0f; s.y = p[buf_];
    run_op(be, s);
    be.all_reduce_sum_f32(static_cast<float*>(p[buf_]), std::size_t(T_ * r_), tp_);
    kernels::LoraExpandArgs e;
    e.in_dtype = DType::f32; e.dtype = dtype; e.num_tokens = T_; e.x = p[buf_]; e.num_slices = 1;
    e.lora_b[0] = p[b_]; e.slice_width[0] = nl_; e.max_loras = L_; e.max_rank = r_; e.lora_ranks = ranks(p);
    e.meta = meta_.view(p); e.y = p[y_]; e.y_row_stride = N_; e.offset_start = int64_t(rho_) * nl_;
    e.add_inputs = true;
    run_op(be, e);
  }

 private:
  void gemm(Backend& be, const std::vector<void*>& p) {
    LinearArgs la;
    la.dtype = dtype; la.m = T_; la.n = N_; la.k = kl_; la.x = p[x_]; la.w = p[w_]; la.y = p[y_]; la.ldy = N_;
    be.base_linear(la);
  }
  void reduce_bias(Backend& be, const std::vector<void*>& p) {
    be.all_reduce_sum(p[y_], dtype, std::size_t(T_ * N_), tp_);
    be.add_bias(p[y_], p[bias_], dtype, T_, N_, N_);
  }

  bool fs_ = false;
  int64_t K_ = 0, N_ = 0, kl_ = 0, nl_ = 0;
  int x_ = -1, w_ = -1, bias_ = -1, a_ = -1, b_ = -1, y_ = -1, ws_ = -1, buf_ = -1;
};

// ------------------------------------------------------------------------------------------------
// VocabParallelEmbeddingWithLoRA.
class EmbeddingLayer final : public LayerProblem {
 public:
  EmbeddingLayer(const Case& c, const BatchLayout& lay, const ProblemOptions& o, int rho)
      : LayerProblem(c, lay, o, rho, false) {
    V_ = c.vocab;
    D_ = c.hidden;
    vl_ = V_ / tp_;
    const int64_t v0 = int64_t(rho_) * vl_;
    std::vector<int32_t> ids(static_cast<std::size_t>(T_));
    const uint64_t kid = g_.key("token_ids");
    for (std::size_t t = 0; t < ids.size(); ++t) ids[t] = int32_t(hash_below(kid, t, uint64_t(V_)));
    ids_host_ = ids;
    ids_ = ints("token_ids", ids);
    const uint64_t ke = g_.key("embedding");
    table_ = dense("embedding.rank", dtype, {vl_, D_}, [&](std::size_t i) { return g_.value(ke, uint64_t(v0 * D_) + i, 1.0f); });
    // A^T table [L, V, r] and B [L, D, r], unsharded on every rank.
    a_ = stacked("lora_a", "lora_a", V_, r_, 1.0f, false, [&](int l, int64_t v, int64_t j) {
      return GlobalIdx{uint64_t((int64_t(l) * V_ + v) * r_ + j), int(j)};
    });
    b_ = stacked("lora_b", "lora_b", D_, r_, 1.0f / std::sqrt(float(std::max(1, r_))), false, [&](int l, int64_t d, int64_t j) {
      return GlobalIdx{uint64_t((int64_t(l) * D_ + d) * r_ + j), int(j)};
    });
    y_ = output("y", T_, D_);
  }
  void reference(const std::vector<void*>& p, bool) override {
    const uint64_t ke = g_.key("embedding"), ka = g_.key("lora_a"), kb = g_.key("lora_b");
    const float bs = 1.0f / std::sqrt(float(std::max(1, r_)));
    for (int64_t t : ref_rows()) {
      const int64_t id = ids_host_[std::size_t(t)];
      const int slot = map_[std::size_t(t)];
      for (int64_t d = 0; d < D_; ++d) {
        float v = g_.value(ke, uint64_t(id * D_ + d), 1.0f);
        if (slot >= 0) {
          const int ra = slot_rank_[std::size_t(slot)];
          double acc = 0;
          for (int j = 0; j < ra; ++j)
            acc += double(g_.stacked(ka, uint64_t((int64_t(slot) * V_ + id) * r_ + j), 1.0f, j, ra, false)) *
                   double(g_.stacked(kb, uint64_t((int64_t(slot) * D_ + d) * r_ + j), bs, j, ra, false));
          v = round_to(dtype, v + round_to(dtype, float(acc)));
        }
        kernels::store_elem(p[y_], dtype, std::size_t(t * D_ + d), v);
      }
    }
  }
  Work work() const override {
    Work w;
    w.tokens = T_;
    w.bytes = double(T_) * 4 + tokens_rank_ * double(es_) + sum_active_rank_ * double(D_) * double(es_) +
              2.0 * double(lora_T_) * double(D_) * double(es_);
    w.flops = 2.0 * tokens_rank_ * double(D_);
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({T_, D_, r_, true});
    bl.grouped.push_back({lora_groups(D_, 0, false), true});
    return bl;
  }
  std::vector<Part> parts() override {
    std::vector<Part> v = {{"base", [this](Backend& be, const std::vector<void*>& p) { base(be, p); }},
                           {"lora", [this](Backend& be, const std::vector<void*>& p) { lora(be, p); }}};
    if (tp_ > 1)
      v.push_back({"comm_base_all_reduce", [this](Backend& be, const std::vector<void*>& p) {
                     be.all_reduce_sum(p[y_], dtype, std::size_t(T_ * D_), tp_);
                   }});
    return v;
  }
  std::vector<Comm> comms() const override {
    if (tp_ == 1) return {};
    return {{"all_reduce", double(T_) * double(D_) * double(es_), tp_, "comm_base_all_reduce"}};
  }

 protected:
  void base(Backend& be, const std::vector<void*>& p) override {
    be.embedding_lookup(p[y_], p[table_], static_cast<const int32_t*>(p[ids_]), dtype, T_, D_, int64_t(rho_) * vl_,
                        int64_t(rho_ + 1) * vl_, D_);
    be.all_reduce_sum(p[y_], dtype, std::size_t(T_ * D_), tp_);  // one nonzero term per element: exact
  }
  void lora(Backend& be, const std::vector<void*>& p) override {
    kernels::AddLoraEmbeddingArgs a;
    a.dtype = dtype; a.num_tokens = T_; a.token_ids = static_cast<const int32_t*>(p[ids_]); a.vocab_size = V_;
    a.embed_dim = D_; a.lora_a = p[a_]; a.lora_b = p[b_]; a.max_loras = L_; a.max_rank = r_;
    a.lora_ranks = ranks(p); a.meta = meta_.view(p); a.y = p[y_]; a.y_row_stride = D_; a.add_inputs = true;
    run_op(be, a);
  }

 private:
  int64_t V_ = 0, D_ = 0, vl_ = 0;
  std::vector<int32_t> ids_host_;
  int ids_ = -1, table_ = -1, a_ = -1, b_ = -1, y_ = -1;
};

// ------------------------------------------------------------------------------------------------
// LogitsProcessorWithLoRA: one row per request, routed by the request-level (prompt) mapping.
// The gather: the rank's dtype logits [R, V/tp] move through the fp32 all-gather as raw 32-bit
// words (an all-gather only moves bytes, NCCL and MPI never do arithmetic on them), so the full
// dtype logits arrive bit-exact, as vLLM's dtype gather. A 16-bit shard of odd width is padded by
// one element per row and compacted after the gather (vLLM's sharded_to_full_mapping step).
class LogitsLayer final : public LayerProblem {
 public:
  LogitsLayer(const Case& c, const BatchLayout& lay, const ProblemOptions& o, int rho)
      : LayerProblem(c, lay, o, rho, true) {
    V_ = c.vocab;
    K_ = c.hidden;
    vl_ = V_ / tp_;
    const int64_t v0 = int64_t(rho_) * vl_;
    ldl_ = (vl_ * int64_t(es_)) % 4 == 0 ? vl_ : vl_ + 1;
    words_ = ldl_ * int64_t(es_) / 4;
    const float ws = 1.0f / std::sqrt(float(K_));
    const uint64_t kx = g_.key("x"), kw = g_.key("weight");
    x_ = dense("x", dtype, {T_, K_}, [&](std::size_t i) { return g_.value(kx, i, 1.0f); });
    w_ = dense("weight.rank", dtype, {vl_, K_}, [&](std::size_t i) { return g_.value(kw, uint64_t(v0 * K_) + i, ws); });
    a_ = stacked("lora_a", "lora_a", r_, K_, ws, false, [&](int l, int64_t j, int64_t k) {
      return GlobalIdx{uint64_t((int64_t(l) * r_ + j) * K_ + k), int(j)};
    });
    b_ = stacked("lora_b", "lora_b", V_, r_, 1.0f / std::sqrt(float(std::max(1, r_))), false, [&](int l, int64_t v, int64_t j) {
      return GlobalIdx{uint64_t((int64_t(l) * V_ + v) * r_ + j), int(j)};
    });
    y_ = output("y", T_, V_);
    ws_ = scratch("workspace", kernels::add_lora_logits_workspace_bytes(std::max<int64_t>(T_, 1), r_));
    if (tp_ > 1) {
      local_ = scratch("logits_local", std::size_t(T_ * words_) * 4);
      tmp_ = scratch("gather_tmp", std::size_t(T_ * words_) * std::size_t(tp_) * 4);
      if (ldl_ != vl_) gathered_ = scratch("logits_gathered", std::size_t(T_ * words_) * std::size_t(tp_) * 4);
    }
  }
  void reference(const std::vector<void*>& p, bool) override {
    const auto rows = ref_rows();
    const auto X = gen_rows("x", rows, K_, 1.0f);
    const auto U = ref_shrink("lora_a", false, rows, X, K_);
    const uint64_t kw = g_.key("weight"), kb = g_.key("lora_b");
    const float ws = 1.0f / std::sqrt(float(K_));
    parallel_for(V_, [&](int64_t v0, int64_t v1) {
      std::vector<float> w(static_cast<std::size_t>(K_));
      for (int64_t v = v0; v < v1; ++v) {
        for (int64_t k = 0; k < K_; ++k) w[std::size_t(k)] = g_.value(kw, uint64_t(v * K_ + k), ws);
        for (std::size_t i = 0; i < rows.size(); ++i) {
          const float* xi = X.data() + i * std::size_t(K_);
          double acc = dot(xi, w.data(), K_);
          float y = round_to(dtype, float(acc));
          const int slot = map_[std::size_t(rows[i])];
          if (slot >= 0) y = round_to(dtype, y + ref_delta(kb, false, V_, v, slot, U[i]));
          kernels::store_elem(p[y_], dtype, std::size_t(rows[i] * V_ + v), y);
        }
      }
    });
  }
  Work work() const override {
    Work w;
    w.tokens = T_;
    w.bytes = sum_active_rank_ * double(K_) * double(es_) + double(lora_T_) * double(K_) * double(es_) +
              sum_active_rank_ * double(V_) * double(es_) + 2.0 * double(lora_T_) * double(V_) * double(es_);
    w.flops = 2.0 * tokens_rank_ * (double(K_) + double(V_));
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({T_, vl_, K_, false});
    bl.dense.push_back({T_, r_, K_, false});
    bl.dense.push_back({T_, V_, r_, true});
    bl.grouped.push_back({lora_groups(1, K_, true), false});
    bl.grouped.push_back({lora_groups(V_, 0, false), true});
    return bl;
  }
  std::vector<Part> parts() override {
    std::vector<Part> v = {{"base", [this](Backend& be, const std::vector<void*>& p) { base(be, p); }},
                           {"lora", [this](Backend& be, const std::vector<void*>& p) { lora(be, p); }}};
    if (tp_ > 1)
      v.push_back({"comm_base_all_gather", [this](Backend& be, const std::vector<void*>& p) { gather(be, p); }});
    return v;
  }
  std::vector<Comm> comms() const override {
    if (tp_ == 1) return {};
    return {{"all_gather", double(T_) * double(V_) * double(es_), tp_, "comm_base_all_gather"}};
  }

 protected:
  void base(Backend& be, const std::vector<void*>& p) override {
    LinearArgs la;
    la.dtype = dtype; la.m = T_; la.n = vl_; la.k = K_; la.x = p[x_]; la.w = p[w_];
    la.y = tp_ > 1 ? p[local_] : p[y_];
    la.ldy = tp_ > 1 ? ldl_ : V_;
    be.base_linear(la);
    if (tp_ > 1) gather(be, p);
  }
  void lora(Backend& be, const std::vector<void*>& p) override {
    kernels::AddLoraLogitsArgs a;
    a.dtype = dtype; a.num_rows = T_; a.hidden = K_; a.x = p[x_]; a.x_row_stride = K_; a.lora_a = p[a_];
    a.lora_b = p[b_]; a.vocab_size = V_; a.max_loras = L_; a.max_rank = r_; a.lora_ranks = ranks(p);
    a.meta = meta_.view(p); a.scale = 1.0f; a.y = p[y_]; a.y_row_stride = V_; a.workspace = p[ws_];
    run_op(be, a);
  }

 private:
  void gather(Backend& be, const std::vector<void*>& p) {
    const bool direct = ldl_ == vl_;
    be.all_gather_last_dim_f32(static_cast<const float*>(p[local_]), static_cast<float*>(direct ? p[y_] : p[gathered_]),
                               static_cast<float*>(p[tmp_]), T_, words_, tp_);
    if (direct) return;
    for (int64_t i = 0; i < T_; ++i)
      for (int q = 0; q < tp_; ++q)
        be.copy(static_cast<char*>(p[y_]) + std::size_t(i * V_ + q * vl_) * es_,
                static_cast<const char*>(p[gathered_]) + std::size_t(i * tp_ * ldl_ + q * ldl_) * es_,
                std::size_t(vl_) * es_);
  }

  int64_t V_ = 0, K_ = 0, vl_ = 0, ldl_ = 0, words_ = 0;
  int x_ = -1, w_ = -1, a_ = -1, b_ = -1, y_ = -1, ws_ = -1, local_ = -1, tmp_ = -1, gathered_ = -1;
};

}  // namespace

std::unique_ptr<Problem> make_layer_problem(const Case& c, const BatchLayout& lay, const ProblemOptions& o,
                                            int rho) {
  const std::string& l = c.layer;
  PUNICA_REQUIRE(c.tp >= 1 && rho >= 0 && rho < c.tp, ErrorKind::usage, "layer: TP rank out of range");
  if (l == "replicated" || l == "column" || l == "merged_column" || l == "qkv" || l == "merged_qkv") {
    PUNICA_REQUIRE(!c.fully_sharded || c.max_rank % c.tp == 0 || l == "replicated", ErrorKind::usage,
                   "layer: fully sharded needs max_rank divisible by tp");
    return std::make_unique<ColumnLayer>(c, lay, o, rho);
  }
  if (l == "row") return std::make_unique<RowLayer>(c, lay, o, rho);
  if (l == "vocab_embedding") return std::make_unique<EmbeddingLayer>(c, lay, o, rho);
  if (l == "logits") return std::make_unique<LogitsLayer>(c, lay, o, rho);
  if (l == "fused_moe") return make_moe_layer_problem(c, lay, o, rho);
  fail(ErrorKind::usage, "layer: unknown layer kind '" + l + "'");
}

std::unique_ptr<Problem> make_layer_problem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
  const Dist* d = Dist::instance();
  const int tp = std::max(1, c.tp);
  return make_layer_problem(c, lay, o, d ? d->rank() % tp : 0);
}

}  // namespace punica::bench
