// The kit every registry entry builds its Problem with (apps/punica-bench/ops/*.cpp): the one tensor
// builder over the counter-based hash (DESIGN §4), the LoRAKernelMeta tensors, the per-slot token
// counts of the active adapters, and the untouched-element marks of accumulating outputs.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>
#include "apps/punica-bench/ops/exec.h"
#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/registry.h"
#include "kernels/common/error.h"
#include "kernels/common/hash_rng.h"
#include "kernels/common/host_tensor.h"
#include "kernels/lora_meta/lora_meta.h"
#include "reference/lora_reference.h"

namespace punica::bench {

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

using kernels::nan_bits;

// The inputs' values (DESIGN §4): the counter hash of (seed, case id, tensor name, index), uniform
// in [-1, 1) x scale, or small integers in --exact mode; stacked weights zero (NaN with
// --nan-padding) past a slot's true rank. The one generator of the op entries' Builder and the
// layers (which evaluate it at global indices of their shards).
class HashValues {
 public:
  HashValues(const Case& c, const ProblemOptions& o)
      : seed_(c.seed), case_hash_(hash_string(c.id)), exact_(o.exact), nan_padding_(o.nan_padding) {}
  uint64_t key(const std::string& name) const { return hash_key(seed_, case_hash_, hash_string(name)); }
  float value(uint64_t k, uint64_t i, float scale) const {
    return exact_ ? hash_small_int(k, i) : hash_uniform(k, i) * scale;
  }
  // Stacked adapter element at flat index i whose rank index is rank_index.
  float stacked(uint64_t k, uint64_t i, float scale, int64_t rank_index, int slot_rank, bool none) const {
    if (rank_index >= slot_rank) return nan_padding_ ? std::nanf("") : 0.0f;
    return none ? 0.0f : value(k, i, scale);
  }
  bool nan_padding() const { return nan_padding_; }

 private:
  uint64_t seed_, case_hash_;
  bool exact_, nan_padding_;
};

class Builder {
 public:
  Builder(const Case& c, const ProblemOptions& o, std::vector<HostTensor>& out) : h_(c, o), out_(out) {}

  uint64_t key(const std::string& name) const { return h_.key(name); }
  float value(uint64_t k, uint64_t i, float scale) const { return h_.value(k, i, scale); }
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
          kernels::store_elem(t.data.data(), dt, idx, h_.stacked(k, idx, scale, rank_index, slot_rank[l], none));
        }
    return add(std::move(t));
  }

 private:
  HashValues h_;
  std::vector<HostTensor>& out_;
};

using MetaIdx = MetaTensors;

inline MetaIdx add_meta(Builder& b, const std::vector<int32_t>& mapping, int L, bool as_outputs,
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
inline ActiveSet active_set(const std::vector<int32_t>& mapping, int L) {
  ActiveSet a;
  a.tokens_of_slot.assign(std::size_t(L), 0);
  for (int32_t s : mapping) if (s >= 0) ++a.tokens_of_slot[std::size_t(s)];
  for (int l = 0; l < L; ++l) if (a.tokens_of_slot[std::size_t(l)] > 0) a.active_slots.push_back(l);
  return a;
}

// Worst-case meta workspace: the CUDA implementation's size for this problem; the CPU needs none.
inline std::size_t meta_ws_bytes(int64_t T, int L) { return kernels::lora_meta_workspace_bytes(std::max<int64_t>(T, 1), L); }

inline double default_rtol(DType t) { return t == DType::f32 ? 1e-5 : t == DType::f16 ? 5e-3 : 1e-2; }
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
  // Tokens that have an adapter: the only rows of x and y the op must move (DESIGN §7).
  double lora_tokens() const {
    double n = 0;
    for (int l : act.active_slots) n += double(act.tokens_of_slot[std::size_t(l)]);
    return n;
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
  void prepare_meta(Backend& be, const std::vector<void*>& p) const { run_op(be, meta.args(p)); }
  void host_meta(const std::vector<void*>& p) const { ref::lora_meta(meta.args(p)); }
};

// Mark rows of -1 tokens and columns outside [c0, c1) as must-keep in a [T, W] output.
inline void mark_untouched(HostTensor& y, const std::vector<int32_t>& map, int64_t W, int64_t c0, int64_t c1) {
  for (std::size_t t = 0; t < map.size(); ++t)
    for (int64_t c = 0; c < W; ++c)
      if (map[t] < 0 || c < c0 || c >= c1) y.must_keep[t * std::size_t(W) + std::size_t(c)] = 1;
}
// Scenario hooks shared by the entries: the sizes an op needs, and which modules fit it (a module
// that does not fit is a skip: model x module x op crossings are common).
inline void require_hidden(CaseContext& x) {
  if (x.c().hidden <= 0) x.missing("hidden (or model, or model + module)");
}
inline void require_slices(CaseContext& x) {
  if (x.c().slices.empty()) x.missing("slices (or num_slices, or model + module)");
}
inline void require_vocab(CaseContext& x) {
  if (x.c().vocab <= 0) x.missing("vocab (or model)");
}
inline void skip_unless_module(CaseContext& x, std::initializer_list<const char*> fits) {
  const std::string& m = x.c().module;
  if (m.empty()) return;
  for (const char* f : fits)
    if (m == f) return;
  x.skip("module " + m + " does not fit op " + x.c().op +
         (x.c().layer.empty() ? std::string() : " (layer " + x.c().layer + ")"));
}

}  // namespace punica::bench
