// GPU test of moe_lora_align_block_size against the order-free contract of SPEC §4.2
// (ref::check_moe_lora_align): each group's pairs as a set, sentinels, per-block experts and -1
// past the end, num_tokens_post_pad, untouched (poisoned) unprocessed slots, guard regions. Cases:
// block sizes 16/32/64, -1 tokens, disabled slots, expert_map with non-local experts, expert ids
// >= E, lora_ids with -1 first / an id >= L / null, pad_sorted_ids, vLLM's matrix (SPEC §6.4).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/fused_moe_lora/moe_gpu_test_util.h"
#include "kernels/moe_lora_align/moe_lora_align.h"
#include "reference/moe_reference.h"

namespace punica::kernels {
namespace {
using namespace moetest;

void run_align_case(const MoeCase& c) {
  SCOPED_TRACE(c.name);
  const MoeProblem p = make_problem(c);
  DeviceProblem d(p);
  GuardedBuf ds = guarded(p.sorted), de = guarded(p.eids), dn = guarded(p.ntpp);
  MoeLoraAlignArgs a = d.align_args(p);
  a.sorted_token_ids = ds.as<int32_t>();
  a.expert_ids = de.as<int32_t>();
  a.num_tokens_post_pad = dn.as<int32_t>();
  DeviceBuffer ws(std::max<std::size_t>(moe_lora_align_workspace_bytes(c.M, c.k, a.num_experts, p.L), 16));
  a.workspace = ws.get();
  a.workspace_bytes = ws.bytes();
  launch_moe_lora_align(a, nullptr);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> s(p.sorted.size()), e(p.eids.size()), n(p.ntpp.size());
  EXPECT_TRUE(ds.download(s.data())) << "sorted_token_ids guard";
  EXPECT_TRUE(de.download(e.data())) << "expert_ids guard";
  EXPECT_TRUE(dn.download(n.data())) << "num_tokens_post_pad guard";
  EXPECT_TRUE(d.inputs_intact());
  const MoeLoraAlignArgs h = p.align_args();
  EXPECT_EQ(ref::check_moe_lora_align(h, s.data(), e.data(), n.data(), p.sorted.data(), p.eids.data(), p.ntpp.data()), "");
  if (!c.naive)  // vLLM's own check: every non-sentinel entry of a block routes to the block's expert
    for (int l = 0; l < p.L; ++l) {
      if (n[std::size_t(l)] == p.ntpp[std::size_t(l)]) continue;  // untouched slot
      EXPECT_EQ(n[std::size_t(l)] % c.bs, 0);
      EXPECT_LE(n[std::size_t(l)], p.P);
    }
}

std::vector<MoeCase> align_cases() {
  std::vector<MoeCase> v;
  int n = 0;
  for (int bs : {16, 32, 64})
    for (int M : {1, 7, 100, 777})
      for (int variant = 0; variant < 4; ++variant) {
        MoeCase c;
        c.name = "odd" + std::to_string(n);
        c.seed = uint64_t(300 + ++n);
        c.M = M;
        c.k = variant >= 2 ? 6 : 2;
        c.E = variant == 2 ? 64 : variant == 3 ? 160 : 8;
        c.bs = bs;
        c.ranks = {8, 8, 8, 8, 8};
        c.disabled = variant == 1 ? std::vector<int>{2} : std::vector<int>{};
        c.oor_pct = variant % 2 ? 15 : 0;
        c.expert_map = variant == 1 || variant == 3;
        c.lora_ids_mode = variant % 3;
        c.pad_sorted_ids = variant == 2;
        c.naive = variant == 3 && M == 7;
        v.push_back(c);
      }
  // vLLM tests/lora/test_moe_lora_align_sum.py (SPEC §6.4): top_k 6, block 16, every slot enabled.
  for (int M : {100, 200, 1024, 4096})
    for (int E : {64, 128, 256, 512})
      for (int L : {2, 32}) {
        MoeCase c;
        c.name = "vllm_M" + std::to_string(M) + "_E" + std::to_string(E) + "_L" + std::to_string(L);
        c.seed = uint64_t(M * 7 + E + L);
        c.M = M;
        c.k = 6;
        c.E = E;
        c.bs = 16;
        c.ranks.assign(std::size_t(L), 1);
        c.none_pct = 0;
        c.lora_ids_mode = 1;
        c.K = 8;
        c.N = 8;
        c.S = 1;
        v.push_back(c);
      }
  // Regressions: a base + LoRA batch with -1 first, a disabled slot, an id >= L; the expert limit.
  MoeCase r;
  r.name = "mixed_disabled_oob";
  r.M = 300;
  r.k = 4;
  r.E = 32;
  r.none_pct = 50;
  r.disabled = {0, 3};
  r.lora_ids_mode = 2;
  v.push_back(r);
  r.name = "max_experts";
  r.E = kMoeAlignMaxExperts;
  r.M = 2000;
  r.k = 8;
  v.push_back(r);
  return v;
}

class MoeLoraAlign : public ::testing::TestWithParam<MoeCase> {};
TEST_P(MoeLoraAlign, HoldsTheOrderFreeContract) { run_align_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Cases, MoeLoraAlign, ::testing::ValuesIn(align_cases()),
                         [](const auto& i) { return i.param.name; });

TEST(MoeLoraAlignEdge, ZeroTokensTouchesNothing) {
  MoeCase c;
  c.name = "zero";
  c.M = 0;
  run_align_case(c);
  c.naive = true;
  run_align_case(c);
}

}  // namespace
}  // namespace punica::kernels
