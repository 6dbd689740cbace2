// Metadata reference: convert_mapping (SPEC §2.2), compute_meta (§2.4), lora_meta (§2.5, mapping
// always refreshed) — the SPEC worked examples, hand-written edge cases, and the std::stable_sort
// implementation against the independent counting-sort naive::lora_meta on random mappings.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/common/hash_rng.h"
#include "reference/lora_reference.h"

using namespace punica;
using punica::kernels::LoraMetaArgs;
using V32 = std::vector<int32_t>;
using V64 = std::vector<int64_t>;

namespace {

// Output buffers of lora_meta, pre-filled with garbage so that every reset is checked.
struct MetaBufs {
  V32 mapping, sorted, active, counts, start, no_lora{77}, num_active{77};
  MetaBufs(int64_t max_tokens, int L)
      : mapping(size_t(max_tokens), 55), sorted(size_t(max_tokens), 55), active(size_t(L + 1), 55),
        counts(size_t(L + 1), 55), start(size_t(L + 2), 55) {}
  LoraMetaArgs args(const V32& in, int L) {
    LoraMetaArgs a;
    a.num_tokens = int64_t(in.size());
    a.max_loras = L;
    a.token_lora_mapping_in = in.data();
    a.token_lora_mapping = mapping.data();
    a.sorted_token_ids = sorted.data();
    a.active_lora_ids = active.data();
    a.num_tokens_per_lora = counts.data();
    a.lora_token_start_loc = start.data();
    a.no_lora_flag = no_lora.data();
    a.num_active = num_active.data();
    return a;
  }
};

V32 head(const V32& v, size_t n) { return V32(v.begin(), v.begin() + long(n)); }

}  // namespace

TEST(LoraMeta, SpecWorkedExample) {
  const V32 in = {1, -1, 0, 1, -1};
  for (int which = 0; which < 2; ++which) {
    MetaBufs b(8, 4);
    auto a = b.args(in, 4);
    which ? ref::naive::lora_meta(a) : ref::lora_meta(a);
    SCOPED_TRACE(which ? "naive" : "eigen");
    EXPECT_EQ(head(b.mapping, 5), in);
    EXPECT_EQ(head(b.sorted, 5), (V32{1, 4, 2, 0, 3}));
    EXPECT_EQ(b.active, (V32{-1, 0, 1, -1, -1}));
    EXPECT_EQ(b.counts, (V32{2, 1, 2, 0, 0}));
    EXPECT_EQ(b.start, (V32{0, 2, 3, 5, 0, 0}));
    EXPECT_EQ(b.no_lora[0], 0);
    EXPECT_EQ(b.num_active[0], 3);
    EXPECT_EQ(b.mapping[5], 55);  // beyond T untouched
  }
}

TEST(LoraMeta, AllNoLoraStillRefreshesMapping) {
  const V32 in = {-1, -1, -1};
  for (int which = 0; which < 2; ++which) {
    MetaBufs b(4, 2);
    auto a = b.args(in, 2);
    which ? ref::naive::lora_meta(a) : ref::lora_meta(a);
    EXPECT_EQ(head(b.mapping, 3), in);  // chosen semantics: copied even without LoRA
    EXPECT_EQ(head(b.sorted, 3), (V32{0, 1, 2}));
    EXPECT_EQ(b.active, (V32{-1, -1, -1}));
    EXPECT_EQ(b.counts, (V32{3, 0, 0}));
    EXPECT_EQ(b.start, (V32{0, 3, 0, 0}));
    EXPECT_EQ(b.no_lora[0], 1);
    EXPECT_EQ(b.num_active[0], 1);
  }
}

TEST(LoraMeta, ZeroTokensAndLastSlot) {
  for (int which = 0; which < 2; ++which) {
    MetaBufs b(4, 3);
    auto a = b.args({}, 3);
    which ? ref::naive::lora_meta(a) : ref::lora_meta(a);
    EXPECT_EQ(b.active, (V32{-1, -1, -1, -1}));
    EXPECT_EQ(b.counts, (V32{0, 0, 0, 0}));
    EXPECT_EQ(b.start, (V32{0, 0, 0, 0, 0}));
    EXPECT_EQ(b.no_lora[0], 1);  // documented choice: T == 0 counts as "no LoRA"
    EXPECT_EQ(b.num_active[0], 0);
    EXPECT_EQ(b.mapping[0], 55);

    MetaBufs c(4, 3);
    const V32 in = {2, 2, 0, 2};  // last slot, no -1
    auto a2 = c.args(in, 3);
    which ? ref::naive::lora_meta(a2) : ref::lora_meta(a2);
    EXPECT_EQ(head(c.sorted, 4), (V32{2, 0, 1, 3}));
    EXPECT_EQ(c.active, (V32{0, 2, -1, -1}));
    EXPECT_EQ(c.counts, (V32{1, 3, 0, 0}));
    EXPECT_EQ(c.start, (V32{0, 1, 4, 0, 0}));
    EXPECT_EQ(c.no_lora[0], 0);
    EXPECT_EQ(c.num_active[0], 2);
  }
}

TEST(LoraMeta, RandomMappingsMatchNaive) {
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 1 + trial % 9;
    const int64_t T = trial * 7 % 301;
    const uint64_t key = hash_key(11, uint64_t(trial), 0);
    V32 in(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) in[size_t(t)] = int32_t(hash_below(key, uint64_t(t), uint64_t(L + 1))) - 1;
    MetaBufs e(T + 3, L), n(T + 3, L);
    ref::lora_meta(e.args(in, L));
    ref::naive::lora_meta(n.args(in, L));
    EXPECT_EQ(e.mapping, n.mapping);
    EXPECT_EQ(e.sorted, n.sorted);
    EXPECT_EQ(e.active, n.active);
    EXPECT_EQ(e.counts, n.counts);
    EXPECT_EQ(e.start, n.start);
    EXPECT_EQ(e.no_lora, n.no_lora);
    EXPECT_EQ(e.num_active, n.num_active);
    // invariants: tokens of active entry i are sorted[start[i] : start[i]+counts[i]], all with
    // mapping == active[i], ascending (stable)
    for (int i = 0; i < e.num_active[0]; ++i)
      for (int32_t p = e.start[size_t(i)]; p < e.start[size_t(i)] + e.counts[size_t(i)]; ++p) {
        EXPECT_EQ(in[size_t(e.sorted[size_t(p)])], e.active[size_t(i)]);
        if (p > e.start[size_t(i)]) {
          EXPECT_LT(e.sorted[size_t(p - 1)], e.sorted[size_t(p)]);
        }
      }
  }
}

TEST(LoraMeta, RejectsOutOfRangeSlots) {
  for (V32 in : {V32{0, 3}, V32{-2, 0}}) {
    MetaBufs b(4, 3);
    EXPECT_THROW(ref::lora_meta(b.args(in, 3)), Error);
    EXPECT_THROW(ref::naive::lora_meta(b.args(in, 3)), Error);
  }
  MetaBufs b(4, 3);
  try {
    ref::lora_meta(b.args({5}, 3));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage);
  }
}

TEST(ComputeMeta, SpecWorkedExample) {
  auto m = ref::compute_meta({2, 2, -1, -1, -1, 2, 0});
  EXPECT_EQ(m.lora_indices_per_batch, (V64{2, -1, 2, 0}));
  EXPECT_EQ(m.seq_lengths, (V64{2, 3, 1, 1}));
  EXPECT_EQ(m.seq_start_locs, (V64{0, 2, 5, 6}));
  EXPECT_EQ(m.batch_size, 4);
  EXPECT_EQ(m.max_length, 3);
  EXPECT_EQ(m.token_nums, 7);
  EXPECT_FALSE(m.no_lora);
}

TEST(ComputeMeta, NoLoraAndEdgeCases) {
  auto a = ref::compute_meta({-1, -1, -1});
  EXPECT_TRUE(a.no_lora);
  EXPECT_EQ(a.batch_size, 1);
  EXPECT_EQ(a.max_length, 3);
  auto b = ref::compute_meta({-1, 0, -1});
  EXPECT_FALSE(b.no_lora);
  EXPECT_EQ(b.seq_lengths, (V64{1, 1, 1}));
  auto c = ref::compute_meta({3});
  EXPECT_EQ(c.lora_indices_per_batch, (V64{3}));
  EXPECT_EQ(c.seq_start_locs, (V64{0}));
  EXPECT_FALSE(c.no_lora);
  auto d = ref::compute_meta({});
  EXPECT_EQ(d.batch_size, 0);
  EXPECT_EQ(d.token_nums, 0);
  EXPECT_EQ(d.max_length, 0);
  EXPECT_FALSE(d.no_lora);
}

TEST(ConvertMapping, HandExample) {
  const std::vector<std::optional<int64_t>> slots = {std::nullopt, 7, 3};
  auto r = ref::convert_mapping({3, 3, 0, 7, 0}, {7, 0, 3}, slots, /*max_loras_arg=*/4, 100);
  EXPECT_EQ(r.base_indices, (V32{2, 2, -1, 1, -1}));
  EXPECT_EQ(r.embeddings_indices, (V64{200, 200, 0, 100, 0}));
  EXPECT_EQ(r.sampler_indices, (V32{1, -1, 2}));
  // j + s'(j) * R with R = 3, s' = max_loras_arg - 1 = 3 for -1
  EXPECT_EQ(r.sampler_indices_padded, (V64{3, 10, 8}));
  EXPECT_EQ(r.indices_len, (V64{5, 3, 3, 5}));
}

TEST(ConvertMapping, FirstSlotWinsAndEmpty) {
  const std::vector<std::optional<int64_t>> slots = {5, 5, std::nullopt};
  auto r = ref::convert_mapping({5}, {5}, slots, 3, 10);
  EXPECT_EQ(r.base_indices, (V32{0}));
  EXPECT_EQ(r.sampler_indices, (V32{0}));
  EXPECT_EQ(r.embeddings_indices, (V64{0}));
  auto e = ref::convert_mapping({}, {}, slots, 3, 10);
  EXPECT_TRUE(e.base_indices.empty());
  EXPECT_TRUE(e.sampler_indices_padded.empty());
  EXPECT_EQ(e.indices_len, (V64{0, 0, 0, 0}));
}

TEST(ConvertMapping, UnknownIdThrowsUsage) {
  const std::vector<std::optional<int64_t>> slots = {std::nullopt, 7};
  try {
    ref::convert_mapping({7, 9}, {7}, slots, 2, 10);
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage);
  }
  EXPECT_THROW(ref::convert_mapping({7}, {9}, slots, 2, 10), Error);  // unknown in prompts
}
