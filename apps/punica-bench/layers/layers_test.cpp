// Host-side tests of the TP LoRA layers: the shard index math of SPEC §5 (q/kv ids with kv-head
// replication, rank-sharded true ranks, column plans), that every rank's shard equals the slice of
// the unsharded tensors, and SPEC's column invariant run on the CPU backend in one process
// (plain column-family layers need no collective): concat over ranks per slice == tp = 1 output.
#include "apps/punica-bench/layers/layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "apps/punica-bench/backend/backend.h"

namespace punica::bench {
namespace {

using layers::column_plan;
using layers::qkv_shard;
using layers::shard_true_rank;

Case layer_case(const std::string& fields) {
  std::string text = R"({"schema": "punica-bench.scenario/1", "name": "t", "defaults": {"op": "layer",
      "max_loras": 4, "num_adapters": 3, "ranks": [8, 16], "max_rank": 16, "no_lora_fraction": 0.25,
      "dtype": "bf16", "seed": 7, "num_requests": 6, "tokens_per_request": 2}, "cases": [{"name": "c", )" +
                     fields + "}]}";
  Scenario s = parse_scenario(text, "mem.json");
  EXPECT_EQ(s.cases.size(), 1u);
  EXPECT_EQ(s.cases.at(0).skip_reason, "");
  return s.cases.at(0);
}

TEST(QkvShard, GqaWithoutReplication) {
  auto q = qkv_shard(32, 8, 128, 8, 5);  // Llama-3-8B at tp 8: one kv head per rank
  EXPECT_EQ(q.q_total, 4096);
  EXPECT_EQ(q.kv_total, 1024);
  EXPECT_EQ(q.q_sh, 512);
  EXPECT_EQ(q.kv_sh, 128);
  EXPECT_EQ(q.rep, 1);
  EXPECT_EQ(q.q_id, 5);
  EXPECT_EQ(q.kv_id, 5);
}

TEST(QkvShard, KvHeadReplicationWhenTpExceedsKvHeads) {
  // 16 q heads, 2 kv heads of 64: tp 4 -> rep 2, tp 8 -> rep 4; every rank keeps one kv head.
  for (int tp : {4, 8}) {
    for (int rho = 0; rho < tp; ++rho) {
      auto q = qkv_shard(16, 2, 64, tp, rho);
      EXPECT_EQ(q.rep, tp / 2);
      EXPECT_EQ(q.q_sh, 16 / tp * 64);
      EXPECT_EQ(q.kv_sh, 64);
      EXPECT_EQ(q.q_id, rho);
      EXPECT_EQ(q.kv_id, rho / (tp / 2));
    }
  }
  auto q = qkv_shard(16, 2, 64, 2, 1);
  EXPECT_EQ(q.rep, 1);
  EXPECT_EQ(q.kv_id, 1);
  EXPECT_EQ(q.kv_sh, 64);
}

TEST(ShardTrueRank, ClampsPerRankRows) {
  // r = 16, tp = 4: each rank owns 4 rank rows.
  const int want8[4] = {4, 4, 0, 0}, want5[4] = {4, 1, 0, 0}, want16[4] = {4, 4, 4, 4};
  for (int rho = 0; rho < 4; ++rho) {
    EXPECT_EQ(shard_true_rank(8, 16, 4, rho), want8[rho]);
    EXPECT_EQ(shard_true_rank(5, 16, 4, rho), want5[rho]);
    EXPECT_EQ(shard_true_rank(16, 16, 4, rho), want16[rho]);
    EXPECT_EQ(shard_true_rank(0, 16, 4, rho), 0);
  }
  for (int tp : {1, 2, 4, 8})
    for (int ra = 0; ra <= 16; ++ra) {
      int sum = 0;
      for (int rho = 0; rho < tp; ++rho) sum += shard_true_rank(ra, 16, tp, rho);
      EXPECT_EQ(sum, ra) << "tp " << tp << " rank " << ra;
    }
}

TEST(ColumnPlan, MergedColumnVariableSlicesConcatPerSlice) {
  Case c = layer_case(R"("layer": "merged_column", "hidden": 64, "slices": [32, 64, 48], "tp": 4)");
  const int tp = 4;
  int64_t off = 0;
  for (int s = 0; s < 3; ++s) {
    std::vector<int64_t> concat;
    for (int rho = 0; rho < tp; ++rho) {
      auto p = column_plan(c, tp, rho);
      ASSERT_EQ(p.slices.size(), 3u);
      EXPECT_EQ(p.packed_rows, 144);
      EXPECT_EQ(p.local_width(), 144 / tp);
      const auto& sl = p.slices[std::size_t(s)];
      EXPECT_EQ(sl.lora, s);
      for (std::size_t j = 0; j < sl.b_rows.size(); ++j) {
        EXPECT_EQ(sl.w_rows[j], off + sl.b_rows[j]);  // slice s of the packed weight
        concat.push_back(sl.w_rows[j]);
      }
    }
    ASSERT_EQ(int64_t(concat.size()), c.slices[std::size_t(s)]);
    for (std::size_t j = 0; j < concat.size(); ++j) EXPECT_EQ(concat[j], off + int64_t(j));
    off += c.slices[std::size_t(s)];
  }
}

TEST(ColumnPlan, QkvAndMergedQkvWithReplication) {
  for (std::string layer : {"qkv", "merged_qkv"}) {
    Case c = layer_case(R"("layer": ")" + layer + R"(", "model": "gqa-tiny", "module": "qkv", "tp": 8)");
    const int tp = 8;
    const int64_t Q = 16 * 64, KV = 2 * 64;
    std::vector<int64_t> q_rows;
    std::set<int64_t> k_rows, v_rows;
    for (int rho = 0; rho < tp; ++rho) {
      auto p = column_plan(c, tp, rho);
      EXPECT_EQ(p.packed_rows, Q + 2 * KV);
      EXPECT_EQ(p.local_width(), Q / tp + 2 * 64);
      std::vector<int64_t> w, b;
      for (auto& sl : p.slices) { w.insert(w.end(), sl.w_rows.begin(), sl.w_rows.end()); b.insert(b.end(), sl.b_rows.begin(), sl.b_rows.end()); }
      const int64_t qs = Q / tp, kv_id = rho / 4;
      for (int64_t j = 0; j < qs; ++j) { EXPECT_EQ(w[std::size_t(j)], rho * qs + j); q_rows.push_back(w[std::size_t(j)]); }
      for (int64_t j = 0; j < 64; ++j) {
        EXPECT_EQ(w[std::size_t(qs + j)], Q + kv_id * 64 + j);
        EXPECT_EQ(w[std::size_t(qs + 64 + j)], Q + KV + kv_id * 64 + j);
        k_rows.insert(w[std::size_t(qs + j)]);
        v_rows.insert(w[std::size_t(qs + 64 + j)]);
      }
      if (layer == "qkv") {
        ASSERT_EQ(p.slices.size(), 1u);
        EXPECT_EQ(w, b);  // one LoRA over the packed rows
        EXPECT_EQ(p.lora_rows, std::vector<int64_t>({Q + 2 * KV}));
      } else {
        ASSERT_EQ(p.slices.size(), 3u);
        EXPECT_EQ(p.lora_rows, std::vector<int64_t>({Q, KV, KV}));
        EXPECT_EQ(p.slices[1].b_rows.front(), kv_id * 64);
        EXPECT_EQ(p.slices[2].b_rows.front(), kv_id * 64);
      }
    }
    for (std::size_t j = 0; j < q_rows.size(); ++j) EXPECT_EQ(q_rows[j], int64_t(j));
    EXPECT_EQ(int64_t(k_rows.size()), KV);  // the distinct kv_ids cover every kv row
    EXPECT_EQ(int64_t(v_rows.size()), KV);
  }
}

TEST(ColumnPlan, ReplicatedIgnoresTp) {
  Case c = layer_case(R"("layer": "replicated", "hidden": 64, "slices": [96], "tp": 4)");
  auto p = column_plan(c, 4, 3);
  ASSERT_EQ(p.slices.size(), 1u);
  EXPECT_EQ(p.local_width(), 96);
  EXPECT_EQ(p.slices[0].w_rows.front(), 0);
}

// ---- the CPU backend in one process: shards and the column invariant ----
const HostTensor& tensor(const Problem& p, const std::string& name) {
  for (auto& t : p.tensors)
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return p.tensors.front();
}
std::vector<float> values(const HostTensor& t, const void* data) {
  std::vector<float> v(t.numel());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = kernels::load_elem(data, t.dtype, i);
  return v;
}
// Runs the problem on the backend, returns the output y.
std::vector<float> run_y(Backend& be, Problem& P) {
  std::vector<Buffer> bufs;
  std::vector<void*> ptrs;
  for (auto& t : P.tensors) {
    bufs.emplace_back(be, t.bytes());
    if (t.role == Role::scratch) be.zero(bufs.back().get(), t.bytes());
    else be.upload(bufs.back().get(), t.data.data(), t.bytes());
    ptrs.push_back(bufs.back().get());
  }
  P.prepare(be, ptrs);
  P.run(be, ptrs);
  be.synchronize();
  for (std::size_t i = 0; i < P.tensors.size(); ++i)
    if (P.tensors[i].name == "y") {
      std::vector<uint8_t> h(P.tensors[i].bytes());
      be.download(h.data(), ptrs[i], h.size());
      return values(P.tensors[i], h.data());
    }
  ADD_FAILURE() << "no output y";
  return {};
}

TEST(LayerShards, RowShardEqualsSliceOfFullTensors) {
  Case c = layer_case(R"("layer": "row", "model": "gqa-tiny", "module": "o", "tp": 1, "fully_sharded": true)");
  BatchLayout lay = make_layout(c);
  auto full = make_layer_problem(c, lay, {}, 0);
  Case c4 = c;
  c4.tp = 4;  // same id: same hash stream
  const int64_t K = 1024, N = 1024, r = 16, L = 4;
  auto wf = values(tensor(*full, "weight.rank"), tensor(*full, "weight.rank").data.data());
  auto bf = values(tensor(*full, "lora_b.0.rank"), tensor(*full, "lora_b.0.rank").data.data());
  auto af = values(tensor(*full, "lora_a.0.rank"), tensor(*full, "lora_a.0.rank").data.data());
  for (int rho = 0; rho < 4; ++rho) {
    auto part = make_layer_problem(c4, lay, {}, rho);
    auto w = values(tensor(*part, "weight.rank"), tensor(*part, "weight.rank").data.data());
    auto a = values(tensor(*part, "lora_a.0.rank"), tensor(*part, "lora_a.0.rank").data.data());
    auto b = values(tensor(*part, "lora_b.0.rank"), tensor(*part, "lora_b.0.rank").data.data());
    const int64_t kl = K / 4, nl = N / 4;
    ASSERT_EQ(int64_t(w.size()), N * kl);
    for (int64_t n = 0; n < N; n += 37)
      for (int64_t k = 0; k < kl; ++k) ASSERT_EQ(w[std::size_t(n * kl + k)], wf[std::size_t(n * K + rho * kl + k)]);
    for (int64_t l = 0; l < L; ++l)
      for (int64_t j = 0; j < r; ++j)
        for (int64_t k = 0; k < kl; k += 5)
          ASSERT_EQ(a[std::size_t((l * r + j) * kl + k)], af[std::size_t((l * r + j) * K + rho * kl + k)]);
    ASSERT_EQ(int64_t(b.size()), L * nl * r);  // fully sharded: B rows [rho*N/tp, (rho+1)*N/tp)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t n = 0; n < nl; n += 3)
        for (int64_t j = 0; j < r; ++j)
          ASSERT_EQ(b[std::size_t((l * nl + n) * r + j)], bf[std::size_t((l * N + rho * nl + n) * r + j)]);
  }
}

TEST(LayerShards, FullyShardedColumnASliceAndShardRanks) {
  Case c = layer_case(R"("layer": "merged_qkv", "model": "gqa-tiny", "module": "qkv", "tp": 1, "fully_sharded": true)");
  BatchLayout lay = make_layout(c);
  auto full = make_layer_problem(c, lay, {}, 0);
  Case c4 = c;
  c4.tp = 4;
  auto af = values(tensor(*full, "lora_a.1.rank"), tensor(*full, "lora_a.1.rank").data.data());
  const int64_t K = 1024, r = 16, rs = 4;
  for (int rho = 0; rho < 4; ++rho) {
    auto part = make_layer_problem(c4, lay, {}, rho);
    auto a = values(tensor(*part, "lora_a.1.rank"), tensor(*part, "lora_a.1.rank").data.data());
    ASSERT_EQ(int64_t(a.size()), 4 * rs * K);
    for (int64_t l = 0; l < 4; ++l)
      for (int64_t j = 0; j < rs; ++j)
        for (int64_t k = 0; k < K; k += 11)
          ASSERT_EQ(a[std::size_t((l * rs + j) * K + k)], af[std::size_t((l * r + rho * rs + j) * K + k)]);
    const auto& sr = tensor(*part, "lora_ranks.shard");
    const auto* srv = reinterpret_cast<const int32_t*>(sr.data.data());
    for (int l = 0; l < 4; ++l) EXPECT_EQ(srv[l], shard_true_rank(lay.slot_rank[std::size_t(l)], 16, 4, rho));
  }
}

// SPEC §5.2-5.5 invariant, independent of column_plan: per slice, concat over ranks of y_rho ==
// the tp = 1 output (k/v: the rank's kv_id block; replicas agree).
TEST(LayerInvariant, PlainColumnFamilyConcatEqualsUnsharded) {
  auto be = make_cpu_backend(nullptr);
  struct Spec { std::string fields; int tp; };
  for (const Spec& sp : {Spec{R"("layer": "merged_qkv", "model": "gqa-tiny", "module": "qkv")", 4},
                         Spec{R"("layer": "qkv", "model": "gqa-tiny", "module": "qkv")", 8},
                         Spec{R"("layer": "merged_column", "hidden": 256, "slices": [128, 64, 192])", 2},
                         Spec{R"("layer": "column", "hidden": 256, "slices": [128])", 4}}) {
    Case c = layer_case(sp.fields + R"(, "tp": 1)");
    BatchLayout lay = make_layout(c);
    auto p1 = make_layer_problem(c, lay, {}, 0);
    auto y1 = run_y(*be, *p1);
    const int64_t T = c.num_tokens;
    int64_t W1 = 0;
    for (auto n : c.slices) W1 += n;
    ASSERT_EQ(int64_t(y1.size()), T * W1);
    // Global column of local column j on rank rho, from the SPEC formulas.
    auto global_col = [&](int rho, int64_t j) -> int64_t {
      const int tp = sp.tp;
      if (c.layer == "qkv" || c.layer == "merged_qkv") {
        const int64_t Q = int64_t(c.num_heads) * c.head_dim, KV = int64_t(c.num_kv_heads) * c.head_dim;
        const int64_t qs = Q / tp, kvs = int64_t(std::max(1, c.num_kv_heads / tp)) * c.head_dim;
        const int rep = std::max(1, tp / c.num_kv_heads), kv_id = rho / rep;
        if (j < qs) return rho * qs + j;
        if (j < qs + kvs) return Q + kv_id * kvs + (j - qs);
        return Q + KV + kv_id * kvs + (j - qs - kvs);
      }
      int64_t off = 0;
      for (auto n : c.slices) {
        if (j < n / tp) return off + rho * (n / tp) + j;
        j -= n / tp;
        off += n;
      }
      return -1;
    };
    Case ct = c;
    ct.tp = sp.tp;
    for (int rho = 0; rho < sp.tp; ++rho) {
      auto pr = make_layer_problem(ct, lay, {}, rho);
      auto yr = run_y(*be, *pr);
      const int64_t Wr = int64_t(yr.size()) / std::max<int64_t>(T, 1);
      int bad = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < Wr; ++j) {
          float a = yr[std::size_t(t * Wr + j)], e = y1[std::size_t(t * W1 + global_col(rho, j))];
          if (!(std::fabs(a - e) <= 2e-2f * (1.0f + std::fabs(e)))) ++bad;  // 16-bit GEMM order differs
        }
      EXPECT_EQ(bad, 0) << c.layer << " tp " << sp.tp << " rank " << rho;
    }
  }
}

}  // namespace
}  // namespace punica::bench
