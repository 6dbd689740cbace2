// The MoE LoRA kernels run on the CPU through block_emu.h (moe_emu_check.sh builds this) against the
// Eigen reference: the alignment's order-free contract, the fused op's one call and split (the
// intermediate and a bit-equal y), NaN padding, add_lora_w13 / add_lora_w2 with the path rule, on the
// GPU tests' odd-shape grid (moetest::odd_fused_cases) and a few more. Exit 1 on any failure.
#include <cmath>
#include <cstdio>
#include <string>
#include "kernels/fused_moe_lora/fused_moe_lora.h"
#include "kernels/fused_moe_lora/heuristics.h"
#include "kernels/fused_moe_lora/moe_test_util.h"
#include "reference/moe_reference.h"
using namespace punica::kernels;
using namespace punica::kernels::moetest;
namespace ref = punica::ref;
static int fails = 0, total = 0;
#define CHECK(cond, msg) do { ++total; if (!(cond)) { ++fails; std::printf("FAIL %s: %s\n", c.name.c_str(), std::string(msg).c_str()); } } while (0)

// emulated alignment into copies of p's poisoned buffers
struct EmuRouting { std::vector<int32_t> s, e, n; MoeLoraRouting r; };
EmuRouting emu_align(const MoeProblem& p) {
  EmuRouting x{p.sorted, p.eids, p.ntpp, {}};
  MoeLoraAlignArgs a = p.align_args();
  a.sorted_token_ids = x.s.data(); a.expert_ids = x.e.data(); a.num_tokens_post_pad = x.n.data();
  launch_moe_lora_align(a, nullptr);
  x.r.naive = p.c.naive; x.r.block_size = p.c.bs; x.r.max_padded = p.P;
  x.r.sorted_token_ids = x.s.data(); x.r.expert_ids = x.e.data(); x.r.num_tokens_post_pad = x.n.data();
  x.r.lora_ids = p.lora_ids_ptr();
  return x;
}
MoeLoraRouting ref_align(MoeProblem& p) {
  MoeLoraAlignArgs a = p.align_args();
  a.sorted_token_ids = p.sorted.data(); a.expert_ids = p.eids.data(); a.num_tokens_post_pad = p.ntpp.data();
  ref::moe_lora_align(a);
  MoeLoraRouting r; r.naive = p.c.naive; r.block_size = p.c.bs; r.max_padded = p.P;
  r.sorted_token_ids = p.sorted.data(); r.expert_ids = p.eids.data(); r.num_tokens_post_pad = p.ntpp.data();
  r.lora_ids = p.lora_ids_ptr();
  return r;
}

void fused_case(const MoeCase& c) {
  MoeProblem p = make_problem(c);
  const MoeProblem p0 = p;  // poisoned routing buffers
  EmuRouting er = emu_align(p);
  {
    MoeLoraAlignArgs a = p.align_args();
    CHECK(ref::check_moe_lora_align(a, er.s.data(), er.e.data(), er.n.data(), p0.sorted.data(), p0.eids.data(), p0.ntpp.data()) == "", "align contract: " + ref::check_moe_lora_align(a, er.s.data(), er.e.data(), er.n.data(), p0.sorted.data(), p0.eids.data(), p0.ntpp.data()));
  }
  MoeLoraRouting rr = ref_align(p);
  Tensor yref = p.y0, ygot = p.y0;
  auto h = p.args(yref.data()); h.routing = rr; ref::add_lora_fused_moe(h);
  auto g = p.args(ygot.data()); g.routing = er.r; launch_add_lora_fused_moe(g, nullptr);
  std::string rep;
  const auto written = written_mask(p);
  CHECK(compare_y(ygot, yref, p.y0, written, rtol_for(c.dtype), rep) == 0, "one call:" + rep);
  {
    // one call through the scratch (row/K-split shrink, split-K mma shrink + column-tiled expand);
    // the K split sums in another order, so against the reference, not bit-equal to the fused kernel
    Tensor ws = scratch_tensor(p);
    Tensor y3 = p.y0;
    auto g3 = p.args(y3.data()); g3.routing = er.r; g3.intermediate = ws.data();
    launch_add_lora_fused_moe(g3, nullptr);
    std::string rep3;
    CHECK(compare_y(y3, yref, p.y0, written, rtol_for(c.dtype), rep3) == 0, "one call with scratch:" + rep3);
    {  // the scratch's head is the intermediate: rows the shrink visited (not NaN) as the reference's
      Tensor rint(c.inter, std::size_t(c.S) * p.numel * p.R);
      auto h3 = h; h3.intermediate = rint.data(); ref::fused_moe_lora_shrink(h3);
      const std::size_t row = std::size_t(p.R);
      std::size_t bad = 0, seen = 0;
      for (std::size_t r0 = 0; r0 < rint.n; r0 += row) {
        bool any = false;
        for (std::size_t j = 0; j < row; ++j) any = any || !std::isnan(ws.get(r0 + j));
        if (!any) continue;
        ++seen;
        for (std::size_t j = 0; j < row; ++j) {
          const double gv = ws.get(r0 + j), rv = rint.get(r0 + j);
          if (!(std::fabs(gv - rv) <= 1e-2 * (1.0 + std::fabs(rv)))) ++bad;
        }
      }
      CHECK(bad == 0 && (seen > 0 || p.numel == 0 || c.naive), "scratch intermediate: " + std::to_string(bad) + " wrong of " + std::to_string(seen) + " rows");
    }
  }
  // split
  Tensor inter(c.inter, std::size_t(c.S) * p.numel * p.R);
  for (std::size_t i = 0; i < inter.n; ++i) inter.set(i, NAN);
  Tensor rint = inter, y2 = p.y0;
  g.intermediate = inter.data(); g.y = y2.data();
  launch_fused_moe_lora_shrink(g, nullptr);
  launch_fused_moe_lora_expand(g, nullptr);
  h.intermediate = rint.data(); ref::fused_moe_lora_shrink(h);
  std::vector<uint8_t> all(inter.n, 1);
  std::string rep2;
  CHECK(compare_y(inter, rint, rint, all, rtol_for(c.inter == punica::kernels::DType::f32 ? c.dtype : c.inter), rep2) == 0, "intermediate:" + rep2);
  std::string rep4;  // the shrink's K split may sum in another order than the one call
  CHECK(compare_y(y2, yref, p.y0, written, rtol_for(c.dtype), rep4) == 0, "split:" + rep4);
}

void align_only(const MoeCase& c) {
  MoeProblem p = make_problem(c);
  EmuRouting er = emu_align(p);
  MoeLoraAlignArgs a = p.align_args();
  const std::string m = ref::check_moe_lora_align(a, er.s.data(), er.e.data(), er.n.data(), p.sorted.data(), p.eids.data(), p.ntpp.data());
  CHECK(m == "", "align contract: " + m);
}

void w13_case_run(int M, bool emap, int S) {
  const MoeCase c = w13_case("w13_M" + std::to_string(M) + (emap ? "_emap" : "") + "_S" + std::to_string(S), M, emap, 200, 56, S, 32);
  MoeProblem p = make_problem(c);
  std::vector<int32_t> s = p.sorted, e = p.eids, n = p.ntpp, hs = p.sorted, he = p.eids, hn = p.ntpp;
  Tensor y = p.y0, yref = p.y0;
  AddLoraW13Args w;
  w.op = p.args(y.data());
  w.topk_ids = p.topk.data();
  w.expert_map = emap ? p.emap.data() : nullptr;
  w.num_experts_global = p.Eg;
  w.block_size = c.bs;
  w.lora_ids = p.lora_ids.data();
  w.sorted_token_ids = s.data(); w.expert_ids = e.data(); w.num_tokens_post_pad = n.data();
  const MoeLoraRouting r = launch_add_lora_w13(w, nullptr);
  AddLoraW13Args hw = w;
  hw.op.y = yref.data();
  hw.sorted_token_ids = hs.data(); hw.expert_ids = he.data(); hw.num_tokens_post_pad = hn.data();
  const MoeLoraRouting hr = ref::add_lora_w13(hw);
  CHECK(r.naive == (M == 2 && !emap), "path");
  CHECK(w13_w2_mismatch(y, yref, p, r.naive) == "", w13_w2_mismatch(y, yref, p, r.naive));
  const MoeProblem p2 = w2_problem_after(p);
  Tensor y2 = p2.y0, y2ref = p2.y0;
  auto a2 = p2.args(y2.data()); a2.routing = r; launch_add_lora_w2(a2, nullptr);
  auto h2 = p2.args(y2ref.data()); h2.routing = hr; ref::add_lora_w2(h2);
  CHECK(w13_w2_mismatch(y2, y2ref, p2, r.naive) == "", w13_w2_mismatch(y2, y2ref, p2, r.naive));
}

int main(int argc, char** argv) {
  const bool big = argc > 1;
  for (MoeCase c : odd_fused_cases()) {
    fused_case(c);
    c.nan_pad = true; c.name += "_nan"; fused_case(c);
  }
  std::printf("odd cases done: %d checks, %d fails\n", total, fails);
  for (int M : {2, 64, 300}) for (bool emap : {false, true}) for (int S : {2, 1}) w13_case_run(M, emap, S);
  std::printf("w13/w2 done: %d checks, %d fails\n", total, fails);
  {
    MoeCase c; c.name = "zero"; c.M = 0; fused_case(c); c.naive = true; fused_case(c);
    c.name = "max_experts"; c.naive = false; c.M = 300; c.k = 8; c.E = kMoeAlignMaxExperts; align_only(c);
    c.name = "rank_scalar_f32inter"; c.M = 37; c.E = 8; c.k = 2; c.inter = punica::kernels::DType::f32; c.ranks = {7, 3, 0, 7}; c.K = 9; c.N = 5; fused_case(c);
    c.name = "bs128"; c.inter = c.dtype; c.bs = 128; c.M = 300; c.E = 4; c.ranks = {16, 16}; c.K = 64; c.N = 48; fused_case(c);
    c.name = "rank64"; c.bs = 16; c.M = 50; c.E = 8; c.ranks = {64, 32, 64}; c.K = 256; c.N = 300; c.w2 = true; c.S = 1; fused_case(c);
    // column tiles (N odd, > 2 tiles) and shrink row groups (rank 24: 3 groups of 8), decode-sized
    c.name = "tiles_decode"; c.none_pct = 0; c.M = 1; c.k = 2; c.E = 4; c.ranks = {24, 16}; c.K = 40; c.N = 777; c.w2 = false; c.S = 2; fused_case(c);
    c.name = "tiles_decode_naive"; c.naive = true; fused_case(c);
    c.name = "tiles_noadd_off"; c.naive = false; c.M = 9; c.add_inputs = false; c.offset = 5; c.N = 515; c.none_pct = 40; fused_case(c);
    // the mma kernels: shrink (>= 4 pairs per alignment block), expand over 2 column tiles per block
    c.name = "mma_tiles"; c.add_inputs = true; c.offset = 0; c.none_pct = 10; c.M = 300; c.k = 2; c.E = 8; c.bs = 16;
    c.ranks = {16, 9, 16, 0}; c.K = 72; c.N = 5128; c.S = 2; fused_case(c);
    // 4 alignment blocks per expand block (runs of >= 2 blocks: M k >= 32 (L+1) E)
    c.name = "mma_group4"; c.M = 700; c.N = 264; c.ranks = {16, 9, 16, 0}; fused_case(c);
    c.name = "mma_rank40_w2_nan"; c.w2 = true; c.S = 1; c.ranks = {40, 33, 0}; c.N = 136; c.offset = 8;
    c.add_inputs = false; c.nan_pad = true; c.shared_b = true; fused_case(c);
    c.nan_pad = false; c.shared_b = false;
    c.w2 = false; c.S = 2; c.offset = 0; c.add_inputs = true;
    c.name = "tiles_fused_recompute"; c.add_inputs = true; c.offset = 0; c.K = 8; c.N = 1031; c.ranks = {8, 5}; fused_case(c);
  }
  {
    // the split-K mma shrink of the one call (K >= 1024: >= 2 parts of >= 512): K not a multiple of
    // 32 or of the parts, ranks 1 / 17 / 64 mixed, block sizes 16 / 32 / 64, few and many pairs per
    // block, f32 and f16 intermediates, NaN padding, expert_map, lora_ids with a skipped slot
    auto sk = [&](MoeCase c, int want_min_parts) {
      MoeProblem p = make_problem(c);
      FusedMoeLoraArgs a = p.args(nullptr);
      a.routing = ref_align(p);
      const auto pl = punica::kernels::moe_heur::plan(a, true);
      std::printf("%s: %s\n", c.name.c_str(), pl.name().c_str());
      CHECK(pl.ksplit >= want_min_parts, "plan " + pl.name());
      fused_case(c);
    };
    MoeCase c; c.none_pct = 10; c.disabled = {};
    c.name = "splitk_w2_r64mix"; c.w2 = true; c.S = 1; c.M = 12; c.k = 2; c.E = 8; c.K = 4104; c.N = 40;
    c.ranks = {17, 1, 64, 0}; c.bs = 16; sk(c, 8);
    c.name = "splitk_w2_r64mix_nan_noadd"; c.nan_pad = true; c.add_inputs = false; c.offset = 8; sk(c, 8);
    c.nan_pad = false; c.add_inputs = true; c.offset = 0;
    c.name = "splitk_w13_bs32"; c.w2 = false; c.S = 2; c.M = 40; c.E = 4; c.K = 1032; c.N = 24; c.ranks = {16, 9};
    c.bs = 32; sk(c, 2);
    c.name = "splitk_bs64_many"; c.M = 150; c.E = 2; c.K = 2056; c.ranks = {32, 17}; c.bs = 64; c.N = 16; sk(c, 4);
    c.name = "splitk_f16_f32inter_emap"; c.dtype = punica::kernels::DType::f16; c.inter = punica::kernels::DType::f32;
    c.M = 20; c.E = 8; c.bs = 16; c.K = 1544; c.ranks = {64, 1, 33}; c.expert_map = true; c.lora_ids_mode = 2;
    c.oor_pct = 10; c.disabled = {1}; c.shared_a = true; sk(c, 3);
    c.name = "splitk_f16_rank1"; c.inter = c.dtype; c.expert_map = false; c.lora_ids_mode = 1; c.oor_pct = 0;
    c.disabled = {}; c.shared_a = false; c.M = 6; c.k = 1; c.E = 2; c.K = 1024; c.ranks = {1}; c.S = 1; sk(c, 2);
  }
  std::printf("split-K done: %d checks, %d fails\n", total, fails);
  for (int M : {100, 4096})  // vLLM's alignment matrix corners (SPEC §6.4)
    for (int E : {64, 512})
      for (int L : {2, 32}) {
        MoeCase c;
        c.name = "align_M" + std::to_string(M) + "_E" + std::to_string(E) + "_L" + std::to_string(L);
        c.M = M; c.k = 6; c.E = E; c.bs = 16; c.ranks.assign(std::size_t(L), 1); c.none_pct = 0; c.K = 8; c.N = 8; c.S = 1;
        align_only(c);
        c.name += "_mixed"; c.none_pct = 50; c.disabled = {0}; c.lora_ids_mode = 2; c.expert_map = 2 * E <= kMoeAlignMaxExperts; c.oor_pct = 10;
        align_only(c);
      }
  std::printf("alignment matrix done: %d checks, %d fails\n", total, fails);
  if (big) {
    MoeCase c; c.name = "vllm_like"; c.M = 100; c.k = 6; c.E = 64; c.K = 2048; c.N = 1408; c.S = 1; c.ranks = {16, 16, 16, 16}; c.none_pct = 0; c.disabled = {};
    fused_case(c);
  }
  std::printf("TOTAL %d checks, %d fails\n", total, fails);
  return fails ? 1 : 0;
}
