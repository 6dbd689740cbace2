// The op registry: Case -> Problem for every dense PunicaWrapper op (see problem.h). Inputs come
// from the counter-based hash of (seed, case id, tensor name, index); weights are zero-padded past
// each adapter's true rank as vLLM stacks them (or NaN-padded with --nan-padding).
#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/layers/layers.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include "kernels/common/error.h"
#include "kernels/common/hash_rng.h"
#include "reference/lora_reference.h"

namespace punica::bench {
namespace {

using kernels::DType;

// Outputs get kGuardCols extra columns after the op's window, checked bit-equal to y0 (nothing
// outside the slices is written). 64 keeps every row on the 128-byte line boundaries of a
// contiguous vLLM output (row pitch = the output width, a multiple of 64 in every model shape)
// whenever the window is: with 8 (16-byte aligned rows only) each row started 16 bytes into a
// line, so every 256-byte piece of y a kernel read and wrote touched a partial sector at each end,
// and the timed y read-modify-write ran slower than on vLLM's layout (H200, bench qkv expand
// T=8192 r=16: 79.8 against 67.9 us back to back; results/NOTES.md v14).
// Odd windows (hidden 2049, offsets) still exercise the unaligned paths.
constexpr int64_t kGuardCols = 64;

uint32_t nan_bits(DType t) { return t == DType::f32 ? 0x7fc00000u : t == DType::f16 ? 0x7e00u : 0x7fc0u; }

class Builder {
 public:
  Builder(const Case& c, const ProblemOptions& o, std::vector<HostTensor>& out)
      : c_(c), o_(o), out_(out), case_hash_(hash_string(c.id)) {}

  uint64_t key(const std::string& name) const { return hash_key(c_.seed, case_hash_, hash_string(name)); }
  float value(uint64_t k, uint64_t i, float scale) const {
    return o_.exact ? hash_small_int(k, i) : hash_uniform(k, i) * scale;
  }
  int add(HostTensor t) { out_.push_back(std::move(t)); return int(out_.size()) - 1; }

  // Dense random tensor.
  int random(const std::string& name, DType dt, std::vector<int64_t> shape, float scale, Role role = Role::input) {
    HostTensor t;
    t.name = name; t.dtype = dt; t.shape = std::move(shape); t.role = role;
    t.data.resize(t.bytes());
    uint64_t k = key(name);
    for (std::size_t i = 0; i < t.numel(); ++i) kernels::store_elem(t.data.data(), dt, i, value(k, i, scale));
    return add(std::move(t));
  }
  // Output filled with NaN (write-only) or random y0 (accumulating).
  int output(const std::string& name, DType dt, std::vector<int64_t> shape, bool accumulate,
             int64_t rows, int64_t inner) {
    int i = accumulate ? random(name, dt, std::move(shape), 1.0f, Role::output) : -1;
    if (!accumulate) {
      HostTensor t;
      t.name = name; t.dtype = dt; t.shape = std::move(shape); t.role = Role::output;
      t.data.resize(t.bytes());
      for (std::size_t e = 0; e < t.numel(); ++e)
        if (dt == DType::f32) reinterpret_cast<uint32_t*>(t.data.data())[e] = nan_bits(dt);
        else reinterpret_cast<uint16_t*>(t.data.data())[e] = uint16_t(nan_bits(dt));
      i = add(std::move(t));
    }
    out_[i].rows = rows; out_[i].inner = inner;
    out_[i].must_keep.assign(out_[i].numel(), 0);
    return i;
  }
  int ints(const std::string& name, const std::vector<int32_t>& v, Role role = Role::input) {
    HostTensor t;
    t.name = name; t.is_int = true; t.shape = {int64_t(v.size())}; t.role = role;
    t.data.resize(v.size() * 4);
    if (!v.empty()) std::memcpy(t.data.data(), v.data(), v.size() * 4);
    return add(std::move(t));
  }
  int scratch(const std::string& name, std::size_t bytes) {
    HostTensor t;
    t.name = name; t.role = Role::scratch; t.scratch_bytes = bytes; t.is_int = true;
    t.shape = {int64_t((bytes + 3) / 4)};
    return add(std::move(t));
  }
  // Stacked LoRA weights. a_layout: [L, r, K] with rows j < rank valid; else [L, N, r] with
  // columns k < rank valid. Padding is 0 (vLLM) or NaN (--nan-padding). none = all-zero slice.
  int stacked(const std::string& name, DType dt, int L, int64_t d1, int64_t d2, bool rank_rows,
              const std::vector<int32_t>& slot_rank, float scale, bool none) {
    HostTensor t;
    t.name = name; t.dtype = dt; t.shape = {L, d1, d2}; t.role = Role::input;
    t.data.resize(t.bytes());
    uint64_t k = key(name);
    for (int l = 0; l < L; ++l)
      for (int64_t i = 0; i < d1; ++i)
        for (int64_t j = 0; j < d2; ++j) {
          std::size_t idx = (std::size_t(l) * d1 + i) * d2 + j;
          int64_t rank_index = rank_rows ? i : j;
          float v;
          if (rank_index >= slot_rank[l]) v = o_.nan_padding ? std::nanf("") : 0.0f;
          else v = none ? 0.0f : value(k, idx, scale);
          kernels::store_elem(t.data.data(), dt, idx, v);
        }
    return add(std::move(t));
  }

 private:
  const Case& c_;
  const ProblemOptions& o_;
  std::vector<HostTensor>& out_;
  uint64_t case_hash_;
};

using MetaIdx = MetaTensors;

MetaIdx add_meta(Builder& b, const std::vector<int32_t>& mapping, int L, bool as_outputs,
                 std::size_t ws_bytes) {
  MetaIdx m;
  m.mapping = b.ints("token_lora_mapping_in", mapping);
  int64_t T = int64_t(mapping.size());
  m.T = T;
  m.L = L;
  auto mk = [&](const std::string& n, int64_t len) {
    if (!as_outputs) return b.scratch(n, std::size_t(std::max<int64_t>(len, 1)) * 4);
    std::vector<int32_t> poison(std::size_t(len), 0x7f7f7f7f);
    return b.ints(n, poison, Role::output);
  };
  m.tlm = mk("token_lora_mapping", T);
  m.sorted = mk("sorted_token_ids", T);
  m.active = mk("active_lora_ids", L + 1);
  m.counts = mk("num_tokens_per_lora", L + 1);
  m.start = mk("lora_token_start_loc", L + 2);
  m.nolora = mk("no_lora_flag", 1);
  m.nactive = mk("num_active", 1);
  m.ws_bytes = std::max<std::size_t>(ws_bytes, 16);
  m.ws = b.scratch("meta_workspace", m.ws_bytes);
  return m;
}


// Per-slot token counts and the active adapters with their true ranks.
struct ActiveSet {
  std::vector<int64_t> tokens_of_slot;
  std::vector<int> active_slots;
};
ActiveSet active_set(const std::vector<int32_t>& mapping, int L) {
  ActiveSet a;
  a.tokens_of_slot.assign(std::size_t(L), 0);
  for (int32_t s : mapping) if (s >= 0) ++a.tokens_of_slot[std::size_t(s)];
  for (int l = 0; l < L; ++l) if (a.tokens_of_slot[std::size_t(l)] > 0) a.active_slots.push_back(l);
  return a;
}

// Worst-case meta workspace: the CUDA implementation's size for this problem; the CPU needs none.
std::size_t meta_ws_bytes(int64_t T, int L) { return kernels::lora_meta_workspace_bytes(std::max<int64_t>(T, 1), L); }

double default_rtol(DType t) { return t == DType::f32 ? 1e-5 : t == DType::f16 ? 5e-3 : 1e-2; }

// ------------------------------------------------------------------------------------------------
class LoraMetaProblem final : public Problem {
 public:
  LoraMetaProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) : L_(c.max_loras) {
    Builder b(c, o, tensors);
    T_ = c.num_tokens;
    m_ = add_meta(b, lay.token_slot, L_, /*as_outputs=*/true, meta_ws_bytes(T_, L_));
    dtype = DType::f32;
  }
  void run(Backend& be, const std::vector<void*>& p) override { be.lora_meta(m_.args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    auto a = m_.args(p);
    if (naive) ref::naive::lora_meta(a); else ref::lora_meta(a);
  }
  Work work() const override {
    Work w;
    w.tokens = T_;
    w.bytes = double(T_) * 4 * 3 + double(L_ + 1) * 12;  // read mapping; write copy + sorted; small arrays
    return w;
  }

 private:
  int L_;
  int64_t T_;
  MetaIdx m_;
};

// Common state of the token-mapped ops.
struct LoraCommon {
  int L = 0, r = 0, S = 1;
  int64_t T = 0, K = 0;
  std::vector<int64_t> N;
  std::vector<int32_t> slot_rank, mapping;
  int ranks_idx = -1;
  MetaIdx meta;
  ActiveSet act;
  int active_hint = 0;  // num_active_loras passed to the ops (0 = not given)

  void init(const Case& c, const BatchLayout& lay, Builder& b, const std::vector<int32_t>& map) {
    L = c.max_loras; r = c.max_rank; S = int(c.slices.size()); T = int64_t(map.size()); K = c.hidden;
    N = c.slices;
    slot_rank = lay.slot_rank;
    mapping = map;
    ranks_idx = b.ints("lora_ranks", slot_rank);
    meta = add_meta(b, map, L, false, meta_ws_bytes(T, L));
    act = active_set(map, L);
    // vLLM's num_active_loras: the distinct adapters of the batch, known on the host
    active_hint = c.active_loras_hint ? int(act.active_slots.size()) : 0;
  }
  const int32_t* ranks(const std::vector<void*>& p) const { return static_cast<const int32_t*>(p[ranks_idx]); }
  double sum_active_rank() const {
    double s = 0;
    for (int l : act.active_slots) s += slot_rank[std::size_t(l)];
    return s;
  }
  double sumN() const { double s = 0; for (auto n : N) s += double(n); return s; }
  double lora_tokens_rank() const {  // Σ_t r_slot(t)
    double s = 0;
    for (int32_t v : mapping) if (v >= 0) s += slot_rank[std::size_t(v)];
    return s;
  }
  std::vector<Backend::Group> groups(int64_t n_of_rank_mult, int64_t k, bool rank_is_n) const {
    std::vector<Backend::Group> g;
    for (int l : act.active_slots) {
      int64_t ra = slot_rank[std::size_t(l)];
      if (rank_is_n) g.push_back({act.tokens_of_slot[std::size_t(l)], n_of_rank_mult * ra, k});
      else g.push_back({act.tokens_of_slot[std::size_t(l)], n_of_rank_mult, ra});
    }
    return g;
  }
  void prepare_meta(Backend& be, const std::vector<void*>& p) const { be.lora_meta(meta.args(p)); }
  void host_meta(const std::vector<void*>& p) const { ref::lora_meta(meta.args(p)); }
};

// Mark rows of -1 tokens and columns outside [c0, c1) as must-keep in a [T, W] output.
void mark_untouched(HostTensor& y, const std::vector<int32_t>& map, int64_t W, int64_t c0, int64_t c1) {
  for (std::size_t t = 0; t < map.size(); ++t)
    for (int64_t c = 0; c < W; ++c)
      if (map[t] < 0 || c < c0 || c >= c1) y.must_keep[t * std::size_t(W) + std::size_t(c)] = 1;
}

class ShrinkProblem final : public Problem {
 public:
  ShrinkProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    out_dtype_ = c.intermediate_dtype;
    scale_ = c.scale;
    x_ = b.random("x", dtype, {int64_t(lay.token_slot.size()), c.hidden}, 1.0f);
    k_.init(c, lay, b, lay.token_slot);
    mapping_tensor = k_.meta.mapping;
    float as = 1.0f / std::sqrt(float(c.hidden));
    for (int s = 0; s < k_.S; ++s) {
      bool none = std::find(c.none_slices.begin(), c.none_slices.end(), s) != c.none_slices.end();
      a_[s] = b.stacked("lora_a." + std::to_string(s), dtype, k_.L, k_.r, k_.K, true, k_.slot_rank, as, none);
    }
    y_ = b.output("y", out_dtype_, {k_.S, k_.T, k_.r}, false, k_.T, k_.r);
  }
  kernels::LoraShrinkArgs args(const std::vector<void*>& p) const {
    kernels::LoraShrinkArgs a;
    a.dtype = dtype; a.out_dtype = out_dtype_; a.num_tokens = k_.T; a.hidden = k_.K;
    a.x = p[x_]; a.x_row_stride = k_.K; a.num_slices = k_.S;
    for (int s = 0; s < k_.S; ++s) a.lora_a[s] = p[a_[s]];
    a.max_loras = k_.L; a.max_rank = k_.r; a.lora_ranks = k_.ranks(p); a.num_active_loras = k_.active_hint;
    a.meta = k_.meta.view(p); a.scale = scale_; a.y = p[y_];
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { k_.prepare_meta(be, p); }
  void run(Backend& be, const std::vector<void*>& p) override { be.lora_shrink(args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    k_.host_meta(p);
    if (naive) ref::naive::lora_shrink(args(p)); else ref::lora_shrink(args(p));
  }
  Work work() const override {
    Work w;
    w.tokens = k_.T;
    w.bytes = k_.S * k_.sum_active_rank() * k_.K * 2 + double(k_.T) * k_.K * kernels::dtype_size(dtype) +
              double(k_.S) * k_.T * k_.r * kernels::dtype_size(out_dtype_);
    w.flops = 2.0 * k_.S * k_.lora_tokens_rank() * k_.K;
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({k_.T, int64_t(k_.S) * k_.r, k_.K});
    bl.grouped = k_.groups(k_.S, k_.K, true);
    return bl;
  }
  double rtol() const override { return default_rtol(out_dtype_ == DType::f32 ? dtype : out_dtype_); }

 private:
  LoraCommon k_;
  DType out_dtype_;
  float scale_;
  int x_, y_, a_[kernels::kMaxSlices];
};

class ExpandProblem final : public Problem {
 public:
  ExpandProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    in_dtype_ = c.intermediate_dtype;
    add_inputs_ = c.add_inputs;
    offset_ = c.offset_start;
    k_.init(c, lay, b, lay.token_slot);
    mapping_tensor = k_.meta.mapping;
    x_ = b.random("x", in_dtype_, {k_.S, k_.T, k_.r}, 1.0f);
    float bs = 1.0f / std::sqrt(float(std::max(1, k_.r)));
    for (int s = 0; s < k_.S; ++s) {
      bool none = std::find(c.none_slices.begin(), c.none_slices.end(), s) != c.none_slices.end();
      b_[s] = b.stacked("lora_b." + std::to_string(s), dtype, k_.L, k_.N[s], k_.r, false, k_.slot_rank, bs, none);
    }
    // kGuardCols extra columns after the slices prove nothing outside them is written.
    W_ = offset_ + int64_t(k_.sumN()) + kGuardCols;
    y_ = b.output("y", dtype, {k_.T, W_}, add_inputs_, k_.T, W_);
    mark_untouched(tensors[y_], k_.mapping, W_, offset_, offset_ + int64_t(k_.sumN()));
  }
  kernels::LoraExpandArgs args(const std::vector<void*>& p) const {
    kernels::LoraExpandArgs a;
    a.in_dtype = in_dtype_; a.dtype = dtype; a.num_tokens = k_.T; a.x = p[x_]; a.num_slices = k_.S;
    for (int s = 0; s < k_.S; ++s) { a.lora_b[s] = p[b_[s]]; a.slice_width[s] = k_.N[s]; }
    a.max_loras = k_.L; a.max_rank = k_.r; a.lora_ranks = k_.ranks(p); a.meta = k_.meta.view(p);
    a.num_active_loras = k_.active_hint;
    a.y = p[y_]; a.y_row_stride = W_; a.offset_start = offset_; a.add_inputs = add_inputs_;
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { k_.prepare_meta(be, p); }
  void run(Backend& be, const std::vector<void*>& p) override { be.lora_expand(args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    k_.host_meta(p);
    if (naive) ref::naive::lora_expand(args(p)); else ref::lora_expand(args(p));
  }
  Work work() const override {
    Work w;
    w.tokens = k_.T;
    double yb = double(k_.T) * k_.sumN() * kernels::dtype_size(dtype);
    w.bytes = k_.sum_active_rank() * k_.sumN() * kernels::dtype_size(dtype) +
              double(k_.S) * k_.T * k_.r * kernels::dtype_size(in_dtype_) + (add_inputs_ ? 2 : 1) * yb;
    w.flops = 2.0 * k_.lora_tokens_rank() * k_.sumN();
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({k_.T, int64_t(k_.sumN()), k_.r});
    bl.grouped = k_.groups(int64_t(k_.sumN()), 0, false);
    return bl;
  }
  double rtol() const override { return default_rtol(dtype); }

 private:
  LoraCommon k_;
  DType in_dtype_;
  bool add_inputs_;
  int64_t offset_, W_;
  int x_, y_, b_[kernels::kMaxSlices];
};

class LinearProblem final : public Problem {
 public:
  LinearProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    scale_ = c.scale;
    add_inputs_ = c.add_inputs;
    x_ = b.random("x", dtype, {int64_t(lay.token_slot.size()), c.hidden}, 1.0f);
    k_.init(c, lay, b, lay.token_slot);
    mapping_tensor = k_.meta.mapping;
    float as = 1.0f / std::sqrt(float(c.hidden)), bs = 1.0f / std::sqrt(float(std::max(1, k_.r)));
    for (int s = 0; s < k_.S; ++s) {
      bool none = std::find(c.none_slices.begin(), c.none_slices.end(), s) != c.none_slices.end();
      a_[s] = b.stacked("lora_a." + std::to_string(s), dtype, k_.L, k_.r, k_.K, true, k_.slot_rank, as, none);
      b_[s] = b.stacked("lora_b." + std::to_string(s), dtype, k_.L, k_.N[s], k_.r, false, k_.slot_rank, bs, none);
    }
    W_ = int64_t(k_.sumN()) + kGuardCols;
    y_ = b.output("y", dtype, {k_.T, W_}, add_inputs_, k_.T, W_);
    mark_untouched(tensors[y_], k_.mapping, W_, 0, int64_t(k_.sumN()));
    ws_ = b.scratch("workspace", std::max<std::size_t>(16, kernels::add_lora_linear_workspace_bytes(
                                                                std::max<int64_t>(k_.T, 1), k_.S, k_.r)));
  }
  kernels::AddLoraLinearArgs args(const std::vector<void*>& p) const {
    kernels::AddLoraLinearArgs a;
    a.dtype = dtype; a.num_tokens = k_.T; a.hidden = k_.K; a.x = p[x_]; a.x_row_stride = k_.K;
    a.num_slices = k_.S;
    for (int s = 0; s < k_.S; ++s) { a.lora_a[s] = p[a_[s]]; a.lora_b[s] = p[b_[s]]; a.slice_width[s] = k_.N[s]; }
    a.max_loras = k_.L; a.max_rank = k_.r; a.lora_ranks = k_.ranks(p); a.meta = k_.meta.view(p);
    a.num_active_loras = k_.active_hint;
    a.scale = scale_; a.y = p[y_]; a.y_row_stride = W_; a.add_inputs = add_inputs_; a.workspace = p[ws_];
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { k_.prepare_meta(be, p); }
  void run(Backend& be, const std::vector<void*>& p) override { be.add_lora_linear(args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    k_.host_meta(p);
    if (naive) ref::naive::add_lora_linear(args(p)); else ref::add_lora_linear(args(p));
  }
  Work work() const override {
    Work w;
    w.tokens = k_.T;
    double es = kernels::dtype_size(dtype);
    w.bytes = k_.S * k_.sum_active_rank() * k_.K * es + double(k_.T) * k_.K * es +
              k_.sum_active_rank() * k_.sumN() * es + (add_inputs_ ? 2 : 1) * double(k_.T) * k_.sumN() * es;
    w.flops = 2.0 * k_.lora_tokens_rank() * (k_.S * double(k_.K) + k_.sumN());
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({k_.T, int64_t(k_.S) * k_.r, k_.K});
    bl.dense.push_back({k_.T, int64_t(k_.sumN()), k_.r});
    bl.grouped = k_.groups(k_.S, k_.K, true);
    return bl;
  }
  double rtol() const override { return default_rtol(dtype); }

 private:
  LoraCommon k_;
  float scale_;
  bool add_inputs_;
  int64_t W_;
  int x_, y_, ws_, a_[kernels::kMaxSlices], b_[kernels::kMaxSlices];
};

class EmbeddingProblem final : public Problem {
 public:
  EmbeddingProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    add_inputs_ = c.add_inputs;
    V_ = c.vocab;
    D_ = c.hidden;
    k_.init(c, lay, b, lay.token_slot);
    mapping_tensor = k_.meta.mapping;
    std::vector<int32_t> ids(std::size_t(k_.T));
    uint64_t key = b.key("token_ids");
    for (std::size_t t = 0; t < ids.size(); ++t) ids[t] = int32_t(hash_below(key, t, uint64_t(V_)));
    ids_ = b.ints("token_ids", ids);
    // A^T table [L, V, r]: columns (rank index) past the true rank are padding.
    a_ = b.stacked("lora_a", dtype, k_.L, V_, k_.r, false, k_.slot_rank, 1.0f, false);
    b_ = b.stacked("lora_b", dtype, k_.L, D_, k_.r, false, k_.slot_rank, 1.0f / std::sqrt(float(std::max(1, k_.r))), false);
    W_ = D_ + kGuardCols;
    y_ = b.output("y", dtype, {k_.T, W_}, add_inputs_, k_.T, W_);
    mark_untouched(tensors[y_], k_.mapping, W_, 0, D_);
  }
  kernels::AddLoraEmbeddingArgs args(const std::vector<void*>& p) const {
    kernels::AddLoraEmbeddingArgs a;
    a.dtype = dtype; a.num_tokens = k_.T; a.token_ids = static_cast<const int32_t*>(p[ids_]);
    a.vocab_size = V_; a.embed_dim = D_; a.lora_a = p[a_]; a.lora_b = p[b_]; a.max_loras = k_.L;
    a.max_rank = k_.r; a.lora_ranks = k_.ranks(p); a.meta = k_.meta.view(p); a.y = p[y_];
    a.y_row_stride = W_; a.add_inputs = add_inputs_;
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { k_.prepare_meta(be, p); }
  void run(Backend& be, const std::vector<void*>& p) override { be.add_lora_embedding(args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    k_.host_meta(p);
    if (naive) ref::naive::add_lora_embedding(args(p)); else ref::add_lora_embedding(args(p));
  }
  Work work() const override {
    Work w;
    w.tokens = k_.T;
    double es = kernels::dtype_size(dtype);
    w.bytes = double(k_.T) * 4 + k_.lora_tokens_rank() * es + k_.sum_active_rank() * D_ * es +
              (add_inputs_ ? 2 : 1) * double(k_.T) * D_ * es;
    w.flops = 2.0 * k_.lora_tokens_rank() * D_;
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({k_.T, D_, k_.r});
    bl.grouped = k_.groups(D_, 0, false);
    return bl;
  }
  double rtol() const override { return default_rtol(dtype); }

 private:
  LoraCommon k_;
  bool add_inputs_;
  int64_t V_, D_, W_;
  int ids_, a_, b_, y_;
};

class LogitsProblem final : public Problem {
 public:
  LogitsProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    scale_ = c.scale;
    V_ = c.vocab;
    // One sampled row per request, routed by the request-level (prompt) mapping.
    k_.init(c, lay, b, lay.request_slot);
    k_.N = {V_};
    k_.S = 1;
    mapping_tensor = k_.meta.mapping;
    x_ = b.random("x", dtype, {k_.T, k_.K}, 1.0f);
    a_ = b.stacked("lora_a", dtype, k_.L, k_.r, k_.K, true, k_.slot_rank, 1.0f / std::sqrt(float(k_.K)), false);
    b_ = b.stacked("lora_b", dtype, k_.L, V_, k_.r, false, k_.slot_rank, 1.0f / std::sqrt(float(std::max(1, k_.r))), false);
    W_ = V_ + kGuardCols;
    y_ = b.output("y", dtype, {k_.T, W_}, true, k_.T, W_);
    mark_untouched(tensors[y_], k_.mapping, W_, 0, V_);
    ws_ = b.scratch("workspace", std::max<std::size_t>(16, kernels::add_lora_logits_workspace_bytes(
                                                                std::max<int64_t>(k_.T, 1), k_.r)));
  }
  kernels::AddLoraLogitsArgs args(const std::vector<void*>& p) const {
    kernels::AddLoraLogitsArgs a;
    a.dtype = dtype; a.num_rows = k_.T; a.hidden = k_.K; a.x = p[x_]; a.x_row_stride = k_.K;
    a.lora_a = p[a_]; a.lora_b = p[b_]; a.vocab_size = V_; a.max_loras = k_.L; a.max_rank = k_.r;
    a.lora_ranks = k_.ranks(p); a.meta = k_.meta.view(p); a.scale = scale_; a.y = p[y_];
    a.y_row_stride = W_; a.workspace = p[ws_];
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { k_.prepare_meta(be, p); }
  void run(Backend& be, const std::vector<void*>& p) override { be.add_lora_logits(args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    k_.host_meta(p);
    if (naive) ref::naive::add_lora_logits(args(p)); else ref::add_lora_logits(args(p));
  }
  Work work() const override {
    Work w;
    w.tokens = k_.T;
    double es = kernels::dtype_size(dtype);
    w.bytes = k_.sum_active_rank() * k_.K * es + double(k_.T) * k_.K * es + k_.sum_active_rank() * V_ * es +
              2.0 * double(k_.T) * V_ * es;
    w.flops = 2.0 * k_.lora_tokens_rank() * (double(k_.K) + V_);
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({k_.T, k_.r, k_.K});
    bl.dense.push_back({k_.T, V_, k_.r});
    bl.grouped = k_.groups(1, k_.K, true);
    return bl;
  }
  double rtol() const override { return default_rtol(dtype); }

 private:
  LoraCommon k_;
  float scale_;
  int64_t V_, W_;
  int x_, a_, b_, y_, ws_;
};

class FullLinearProblem final : public Problem {
 public:
  FullLinearProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    L_ = c.max_loras;
    in_ = c.hidden;
    out_ = c.out_features;
    map_ = lay.request_slot;
    R_ = int64_t(map_.size());
    m_ = add_meta(b, map_, L_, false, meta_ws_bytes(R_, L_));
    mapping_tensor = m_.mapping;
    x_ = b.random("x", dtype, {R_, in_}, 1.0f);
    w_ = b.random("weight", dtype, {L_, out_, in_}, 1.0f / std::sqrt(float(in_)));
    bias_ = b.random("bias", dtype, {L_, out_}, 0.5f);
    // Every third adapter slot has its full module disabled (module_enabled = 0).
    enabled_.assign(std::size_t(L_), 0);
    for (std::size_t a = 0; a < lay.adapter_slot.size(); ++a) enabled_[std::size_t(lay.adapter_slot[a])] = (a % 3 != 2);
    en_ = b.ints("module_enabled", enabled_);
    W_ = out_ + kGuardCols;
    y_ = b.output("y", dtype, {R_, W_}, true, R_, W_);
    auto& y = tensors[y_];
    for (int64_t j = 0; j < R_; ++j)
      for (int64_t c2 = 0; c2 < W_; ++c2) {
        int32_t s = map_[std::size_t(j)];
        bool replaced = s >= 0 && enabled_[std::size_t(s)] && c2 < out_;
        y.must_keep[std::size_t(j * W_ + c2)] = !replaced;
      }
  }
  kernels::ApplyLoraFullLinearArgs args(const std::vector<void*>& p) const {
    kernels::ApplyLoraFullLinearArgs a;
    a.dtype = dtype; a.num_rows = R_; a.in_features = in_; a.out_features = out_; a.x = p[x_];
    a.x_row_stride = in_; a.weight = p[w_]; a.bias = p[bias_];
    a.module_enabled = static_cast<const int32_t*>(p[en_]); a.max_loras = L_; a.meta = m_.view(p);
    a.y = p[y_]; a.y_row_stride = W_;
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { be.lora_meta(m_.args(p)); }
  void run(Backend& be, const std::vector<void*>& p) override { be.apply_lora_full_linear(args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    ref::lora_meta(m_.args(p));
    if (naive) ref::naive::apply_lora_full_linear(args(p)); else ref::apply_lora_full_linear(args(p));
  }
  Work work() const override {
    Work w;
    w.tokens = R_;
    double es = kernels::dtype_size(dtype);
    auto act = active_set(map_, L_);
    double used = 0, rows = 0;
    for (int l : act.active_slots) if (enabled_[std::size_t(l)]) { used += 1; rows += double(act.tokens_of_slot[std::size_t(l)]); }
    w.bytes = used * double(out_) * (in_ + 1) * es + rows * in_ * es + 2.0 * rows * out_ * es;
    w.flops = 2.0 * rows * in_ * out_;
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({R_, out_, in_});
    auto act = active_set(map_, L_);
    for (int l : act.active_slots) bl.grouped.push_back({act.tokens_of_slot[std::size_t(l)], out_, in_});
    return bl;
  }
  double rtol() const override { return default_rtol(dtype); }

 private:
  int L_;
  int64_t in_, out_, R_, W_;
  std::vector<int32_t> map_, enabled_;
  MetaIdx m_;
  int x_, w_, bias_, en_, y_;
};

using Factory = std::function<std::unique_ptr<Problem>(const Case&, const BatchLayout&, const ProblemOptions&)>;
template <class P>
Factory factory() {
  return [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return std::make_unique<P>(c, l, o); };
}
const std::map<std::string, Factory>& registry() {
  static const std::map<std::string, Factory> r = {
      {"lora_meta", factory<LoraMetaProblem>()},
      {"lora_shrink", factory<ShrinkProblem>()},
      {"lora_expand", factory<ExpandProblem>()},
      {"add_lora_linear", factory<LinearProblem>()},
      {"add_lora_embedding", factory<EmbeddingProblem>()},
      {"add_lora_logits", factory<LogitsProblem>()},
      {"apply_lora_full_linear", factory<FullLinearProblem>()},
      {"layer", [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return make_layer_problem(c, l, o); }},
  };
  return r;
}

}  // namespace

double Problem::rtol() const { return default_rtol(dtype); }

kernels::LoraMetaArgs MetaTensors::args(const std::vector<void*>& p) const {
  kernels::LoraMetaArgs a;
  a.num_tokens = T;
  a.max_loras = L;
  a.token_lora_mapping_in = static_cast<const int32_t*>(p[std::size_t(mapping)]);
  a.token_lora_mapping = static_cast<int32_t*>(p[std::size_t(tlm)]);
  a.sorted_token_ids = static_cast<int32_t*>(p[std::size_t(sorted)]);
  a.active_lora_ids = static_cast<int32_t*>(p[std::size_t(active)]);
  a.num_tokens_per_lora = static_cast<int32_t*>(p[std::size_t(counts)]);
  a.lora_token_start_loc = static_cast<int32_t*>(p[std::size_t(start)]);
  a.no_lora_flag = static_cast<int32_t*>(p[std::size_t(nolora)]);
  a.num_active = static_cast<int32_t*>(p[std::size_t(nactive)]);
  a.workspace = ws >= 0 ? p[std::size_t(ws)] : nullptr;
  a.workspace_bytes = ws >= 0 ? ws_bytes : 0;
  return a;
}

kernels::LoraMetaView MetaTensors::view(const std::vector<void*>& p) const {
  kernels::LoraMetaView v;
  v.token_lora_mapping = static_cast<const int32_t*>(p[std::size_t(tlm)]);
  v.sorted_token_ids = static_cast<const int32_t*>(p[std::size_t(sorted)]);
  v.active_lora_ids = static_cast<const int32_t*>(p[std::size_t(active)]);
  v.num_tokens_per_lora = static_cast<const int32_t*>(p[std::size_t(counts)]);
  v.lora_token_start_loc = static_cast<const int32_t*>(p[std::size_t(start)]);
  v.no_lora_flag = static_cast<const int32_t*>(p[std::size_t(nolora)]);
  v.num_active = static_cast<const int32_t*>(p[std::size_t(nactive)]);
  return v;
}

std::unique_ptr<Problem> make_problem(const Case& c, const ProblemOptions& o) {
  auto it = registry().find(c.op);
  PUNICA_REQUIRE(it != registry().end(), ErrorKind::usage, "op '" + c.op + "' has no registered problem");
  BatchLayout lay = make_layout(c);
  return it->second(c, lay, o);
}
bool is_registered_op(const std::string& op) { return registry().count(op) > 0; }
std::vector<std::string> registered_ops() {
  std::vector<std::string> v;
  for (auto& kv : registry()) v.push_back(kv.first);
  return v;
}

}  // namespace punica::bench
