// The kernel plans of the ops (each op's one host function returning the kernel kind and its
// configuration), pinned on the host without a GPU: one case per rule, chosen where an earlier rule
// would also match, so that a change of the rule order changes a plan here on purpose.
#include <gtest/gtest.h>
#include <string>
#include "kernels/add_lora_embedding/add_lora_embedding.h"
#include "kernels/add_lora_linear/add_lora_linear.h"
#include "kernels/add_lora_linear/heuristics.h"
#include "kernels/add_lora_logits/add_lora_logits.h"
#include "kernels/apply_lora_full_linear/apply_lora_full_linear.h"
#include "kernels/lora_expand/heuristics.h"
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/lora_meta/lora_meta.h"
#include "kernels/lora_shrink/heuristics.h"
#include "kernels/lora_shrink/lora_shrink.h"

namespace punica::kernels {
namespace {

ShrinkShape shrink_shape(int64_t T, int64_t K, int S, int R, int L, DType dt = DType::bf16, bool vec = true) {
  ShrinkShape s;
  s.dtype = dt;
  s.out_dtype = DType::f32;
  s.T = T;
  s.K = K;
  s.S = S;
  s.R = R;
  s.L = L;
  s.planned = L;
  s.vec = vec;
  return s;
}
constexpr ShrinkDevice kH200{132, true, true};
constexpr ShrinkDevice kNoSm90{132, false, false};
std::string shrink_plan(const ShrinkShape& s, const ShrinkDevice& d = kH200, ShrinkKernel k = ShrinkKernel::automatic) {
  return plan_name(shrink_heur::plan(s, k, d));
}

TEST(ShrinkPlan, NothingOrZeros) {
  EXPECT_EQ(shrink_plan(shrink_shape(0, 4096, 1, 16, 4)), "none");
  EXPECT_EQ(shrink_plan(shrink_shape(16, 4096, 1, 0, 4)), "none");
  EXPECT_EQ(shrink_plan(shrink_shape(16, 4096, 1, 16, 0)), "memset");
  EXPECT_EQ(shrink_plan(shrink_shape(16, 0, 1, 16, 4)), "memset");
}

// Rule 1, the cluster tile, ahead of the decode kernel (qkv r=64, one adapter, T=32: both match).
TEST(ShrinkPlan, ClusterBeforeDecode) {
  const ShrinkShape s = shrink_shape(32, 4096, 3, 64, 1);
  ASSERT_TRUE(shrink_heur::auto_cluster(32, 3, 64, 1) && shrink_heur::use_decode_kernel(32, 3, 64, 1));
  EXPECT_EQ(shrink_plan(s), "cluster/bm32/nbw2/c8");
  EXPECT_EQ(shrink_plan(s, kNoSm90), "decode/token");
  EXPECT_EQ(shrink_plan(shrink_shape(32, 4096, 3, 64, 1, DType::bf16, false)), "decode/token");  // unaligned
  EXPECT_EQ(shrink_plan(s, kH200, ShrinkKernel::no_cluster), "decode/token");
}

// Rule 2, the warp-k tile in the decode band, ahead of the decode kernel (one slice r=64, 32
// adapters, T=128: both match).
TEST(ShrinkPlan, WarpKDecodeBandBeforeDecode) {
  ASSERT_TRUE(shrink_heur::use_decode_kernel(128, 1, 64, 32));
  EXPECT_EQ(shrink_plan(shrink_shape(128, 4096, 1, 64, 32)), "fused_wk/bm64/sk264");
  EXPECT_EQ(shrink_plan(shrink_shape(128, 4096, 1, 64, 32, DType::bf16, false)), "decode/token");
}

// Rule 3, the decode kernel, ahead of the fused tile (qkv r=16, 8 adapters, T=100: auto_fused too).
TEST(ShrinkPlan, DecodeBeforeFused) {
  ASSERT_TRUE(shrink_heur::auto_fused(100, 3, 16, 8) && shrink_heur::auto_cluster(100, 3, 16, 8));
  EXPECT_EQ(shrink_plan(shrink_shape(100, 4096, 3, 16, 8), kNoSm90), "decode/token");
  EXPECT_EQ(shrink_plan(shrink_shape(100, 4096, 3, 16, 8)), "cluster/bm32/nbw2/c8");  // rule 1 first
}

// Rule 4, the 128-token stream-K tile for one slice at rank <= 32, ahead of the wgmma tile (N = 32
// at T=4096 matches auto_wg too).
TEST(ShrinkPlan, FewGroupsStreamKBeforeWgmma) {
  ASSERT_TRUE(shrink_heur::auto_wg(4096, 1, 32, 1));
  EXPECT_EQ(shrink_plan(shrink_shape(4096, 4096, 1, 32, 1)), "fused/bm128/ngw1/sk264");
  EXPECT_EQ(shrink_plan(shrink_shape(4096, 4096, 1, 32, 1), kH200, ShrinkKernel::fused_wg), "wgmma/n32/splitk8");
}

// Rule 5, the wgmma tile, ahead of the warp-k tile (qkv r=16, 8 adapters, T=8192: auto_wk too).
TEST(ShrinkPlan, WgmmaBeforeWarpK) {
  ASSERT_TRUE(shrink_heur::auto_wk(8192, 4096, 3, 16, 132, 8));
  EXPECT_EQ(shrink_plan(shrink_shape(8192, 4096, 3, 16, 8)), "wgmma/n48/sk264");
  EXPECT_EQ(shrink_plan(shrink_shape(8192, 4096, 3, 16, 8), kNoSm90), "fused_wk/bm64/sk264");
}

// The standalone wgmma band: not for add_lora_linear's shrink (small_cluster).
TEST(ShrinkPlan, WgmmaBandStandaloneOnly) {
  ASSERT_TRUE(shrink_heur::auto_wg_band(2048, 3, 16, 1, 4096) && !shrink_heur::auto_wg(2048, 3, 16, 1));
  EXPECT_EQ(shrink_plan(shrink_shape(2048, 4096, 3, 16, 1)), "wgmma/n48/splitk16");
  EXPECT_EQ(shrink_plan(shrink_shape(2048, 4096, 3, 16, 1), kH200, ShrinkKernel::small_cluster),
            "fused/bm64/ngw1/splitk8");
}

// Rule 6, the fused tile, ahead of the legacy mma tiles (qkv r=64, T=2048: use_mma too).
TEST(ShrinkPlan, FusedBeforeMma) {
  ASSERT_TRUE(shrink_heur::use_mma(DType::bf16, DType::f32, 2048));
  EXPECT_EQ(shrink_plan(shrink_shape(2048, 4096, 3, 64, 8), kNoSm90), "fused/bm64/ngw3/splitk8");
  EXPECT_EQ(shrink_plan(shrink_shape(2048, 4096, 3, 64, 8, DType::bf16, false), kNoSm90), "mma/bn64/splitk6");
  EXPECT_EQ(shrink_plan(shrink_shape(2048, 4096, 3, 64, 8), kNoSm90, ShrinkKernel::legacy), "mma/bn64/splitk6");
}

// Rule 8, the GEMV: fp32 inputs, or 16-bit outputs (stores); `legacy` zeroes y by a memset.
TEST(ShrinkPlan, Gemv) {
  EXPECT_EQ(shrink_plan(shrink_shape(16, 4096, 1, 16, 4, DType::f32)), "decode/token");  // rule 3 first
  EXPECT_EQ(shrink_plan(shrink_shape(300, 4096, 1, 16, 4, DType::f32)), "gemv/atomic/splitk16");
  EXPECT_EQ(shrink_plan(shrink_shape(1, 4096, 1, 16, 4, DType::f32), kH200, ShrinkKernel::legacy),
            "gemv/atomic/splitk16/memset");
  ShrinkShape st = shrink_shape(300, 4096, 1, 16, 4);
  st.out_dtype = DType::bf16;
  EXPECT_EQ(shrink_plan(st), "gemv/store");
}

// Forced kinds: fused128_sk's 128-token tiles, fused_nosplit's single pass.
TEST(ShrinkPlan, ForcedKinds) {
  const ShrinkShape s = shrink_shape(2048, 4096, 1, 64, 1);
  EXPECT_EQ(shrink_plan(s, kNoSm90, ShrinkKernel::fused_nosplit), "fused/bm64/ngw1");
  EXPECT_EQ(shrink_plan(s, kNoSm90, ShrinkKernel::fused128_sk), "fused/bm128/ngw2/sk264");
  EXPECT_EQ(shrink_plan(s, kNoSm90, ShrinkKernel::fused_sk), "fused/bm64/ngw1/sk396");
}


// ---------------------------------------------------------------- lora_expand
ExpandShape expand_shape(int64_t T, int S, int R, int L, DType in = DType::f32, bool fast = true) {
  ExpandShape s;
  s.in_dtype = in;
  s.dtype = DType::bf16;
  s.T = T;
  s.S = S;
  s.R = R;
  s.L = L;
  s.planned = L;
  s.b_vec = R % 8 == 0;
  s.fast = fast;
  s.col_tiles128 = S == 1 ? 32 : 48;  // one slice of 4096 / qkv 4096 + 1024 + 1024
  return s;
}
std::string expand_plan(const ExpandShape& s, ExpandPrefillKernel k = ExpandPrefillKernel::automatic,
                        bool after_shrink = false) {
  return plan_name(expand_heur::plan(s, k, after_shrink, 132));
}

TEST(ExpandPlan, NothingDecodeOrGemv) {
  EXPECT_EQ(expand_plan(expand_shape(0, 1, 16, 4)), "none");
  EXPECT_EQ(expand_plan(expand_shape(16, 1, 16, 0)), "none");
  // fp32 weights: no mma kernel; the GEMV where 4-16 tokens per adapter from 64 tokens, else decode
  ExpandShape f = expand_shape(64, 1, 16, 8);
  f.dtype = DType::f32;
  EXPECT_EQ(expand_plan(f), "gemv");
  f.T = 16;
  EXPECT_EQ(expand_plan(f), "decode");
  EXPECT_EQ(expand_plan(expand_shape(200, 3, 12, 8)), "decode");  // rank off a multiple of 8
}

// Small batches: the mma kernels with enough tokens per adapter (small_batch_mma) ahead of decode.
TEST(ExpandPlan, SmallBatchMmaBeforeDecode) {
  EXPECT_EQ(expand_plan(expand_shape(128, 3, 16, 8)), "pipe/bm16/bn128/bk16");  // pipe16_few
  EXPECT_EQ(expand_plan(expand_shape(32, 3, 16, 8)), "decode");
}

// The staged kernel where the streaming / pipelined layouts do not hold (fast_ok), ahead of both.
TEST(ExpandPlan, StagedForOtherLayouts) {
  EXPECT_EQ(expand_plan(expand_shape(8192, 3, 16, 8, DType::f32, false)), "staged");
  EXPECT_EQ(expand_plan(expand_shape(8192, 3, 16, 8), ExpandPrefillKernel::mma_staged), "staged");
}

// The 16-row pipelined tiles (pipe_few_tokens) ahead of the streaming kernel that prefer_stream
// picks (fp32 x, rank 64, 4 tokens per adapter); a 16-bit x keeps the streaming kernel.
TEST(ExpandPlan, FewTokensPipeBeforeStream) {
  EXPECT_EQ(expand_plan(expand_shape(128, 1, 64, 32)), "pipe/bm16/bn128/bk64");
  EXPECT_EQ(expand_plan(expand_shape(128, 1, 64, 32, DType::bf16)), "stream/bm64");
}

// One adapter at rank 64 from 16 to 48 tokens: the pipelined kernel ahead of the streaming one.
TEST(ExpandPlan, OneAdapterPipeBeforeStream) {
  EXPECT_EQ(expand_plan(expand_shape(32, 1, 64, 1)), "pipe/bm64/bn64/bk64");
  EXPECT_EQ(expand_plan(expand_shape(32, 1, 64, 2)), "stream/bm16");
}

// After add_lora_linear's shrink the pipelined kernel stays where a standalone expand streams.
TEST(ExpandPlan, AfterShrinkKeepsPipe) {
  EXPECT_EQ(expand_plan(expand_shape(256, 1, 64, 1)), "stream/bm32");
  EXPECT_EQ(expand_plan(expand_shape(256, 1, 64, 1), ExpandPrefillKernel::automatic, true), "pipe/bm64/bn64/bk64");
}

// From 4096 tokens with an fp32 x, rank above 16: the dual pipelined kernel.
TEST(ExpandPlan, PipeDualFrom4096) {
  EXPECT_EQ(expand_plan(expand_shape(4096, 3, 64, 8)), "pipe_dual/bm64");
  EXPECT_EQ(expand_plan(expand_shape(4095, 3, 64, 8)), "pipe/bm64/bn64/bk64");
  EXPECT_EQ(expand_plan(expand_shape(8192, 3, 64, 8, DType::bf16)), "pipe/bm64/bn64/bk64");
  EXPECT_EQ(expand_plan(expand_shape(8192, 3, 16, 8)), "pipe/bm64/bn128/bk16");
  EXPECT_EQ(expand_plan(expand_shape(8192, 3, 128, 8)), "pipe/bm64/bn64/bk128");  // pipe128_ok
  // above rank 64 the streaming kernel holds two rank chunks (stream_chunks)
  EXPECT_EQ(expand_plan(expand_shape(8192, 3, 128, 8, DType::bf16)), "stream/bm64/ks2");
  EXPECT_EQ(expand_plan(expand_shape(8192, 3, 256, 8)), "stream/bm64/ks2");
  EXPECT_EQ(expand_plan(expand_shape(8192, 1, 512, 8)), "stream/bm64/ks2");
  EXPECT_EQ(expand_plan(expand_shape(512, 1, 128, 8)), "stream/bm32/ks2");  // prefer_stream up to 512 tokens
  EXPECT_EQ(expand_plan(expand_shape(48, 1, 256, 4)), "stream/bm16/ks2");
  EXPECT_EQ(expand_plan(expand_shape(512, 1, 128, 8), ExpandPrefillKernel::mma_pipe), "pipe/bm64/bn64/bk128");
  // a named kind runs in its general configuration
  EXPECT_EQ(expand_plan(expand_shape(16, 3, 16, 8), ExpandPrefillKernel::mma_stream), "stream/bm64");
}

// ---------------------------------------------------------------- add_lora_linear
LinearShape linear_shape(int64_t T, int S, int R, int L, bool cluster_ok = true) {
  LinearShape s;
  s.T = T;
  s.K = 4096;
  s.S = S;
  s.R = R;
  s.L = L;
  s.planned = L;
  s.total_n = S == 1 ? 4096 : 6144;
  s.cluster_ok = cluster_ok;
  return s;
}
LinearChain chain(const LinearShape& s, detail::LinearPath p = detail::LinearPath::automatic) {
  return linear_heur::plan_chain(s, p);
}

TEST(LinearPlan, ChainRules) {
  using C = LinearChain;
  EXPECT_EQ(chain(linear_shape(0, 3, 16, 8)), C::none);
  // the mma tiles (use_tiles) ahead of the split-K partials (use_split_partials also matches)
  ASSERT_TRUE(linear_heur::use_split_partials(64, 8, 16, 4096, 3, 6144));
  EXPECT_EQ(chain(linear_shape(64, 3, 16, 8)), C::cluster);  // small_cluster_pdl_expand
  EXPECT_EQ(chain(linear_shape(64, 3, 16, 8, false)), C::small_tiles);
  // the mma tiles cover use_split_partials' window here (4 tokens per adapter); decode below it
  EXPECT_EQ(chain(linear_shape(64, 3, 64, 16)), C::small_tiles);
  EXPECT_EQ(chain(linear_shape(16, 3, 64, 16)), C::decode);
  // above 128 tokens: the cluster tile where mid_cluster, else lora_shrink's choice
  EXPECT_EQ(chain(linear_shape(256, 1, 16, 1)), C::cluster);
  EXPECT_EQ(chain(linear_shape(256, 1, 16, 1, false)), C::tiles);
  EXPECT_EQ(chain(linear_shape(8192, 3, 16, 8)), C::tiles);
  // decode / partials exist only up to 128 tokens
  EXPECT_EQ(chain(linear_shape(256, 3, 16, 8), detail::LinearPath::decode), C::tiles);
  EXPECT_EQ(chain(linear_shape(16, 3, 16, 8), detail::LinearPath::partials), C::partials);
  EXPECT_EQ(chain(linear_shape(16, 3, 16, 8), detail::LinearPath::tiles), C::small_tiles);
}

// ---------------------------------------------------------------- every op's description (no GPU:
// 132 SMs, neither wgmma nor clusters)
const void* aligned_ptr() { return reinterpret_cast<const void*>(uintptr_t(1) << 20); }
LoraMetaView fake_meta() {
  const int32_t* p = static_cast<const int32_t*>(aligned_ptr());
  return {p, p, p, p, p, p, p};
}

TEST(PlanDescription, EveryOp) {
  void* y = const_cast<void*>(aligned_ptr());
  LoraMetaArgs m;
  m.num_tokens = 100;
  m.max_loras = 8;
  EXPECT_EQ(describe_lora_meta_plan(m), "single");
  m.num_tokens = 10000;
  m.sorted_token_ids = static_cast<int32_t*>(y);
  EXPECT_EQ(describe_lora_meta_plan(m), "chunked/nb5");

  LoraShrinkArgs s;
  s.num_tokens = 8192;
  s.hidden = 4096;
  s.x = aligned_ptr();
  s.num_slices = 3;
  for (int i = 0; i < 3; ++i) s.lora_a[i] = aligned_ptr();
  s.max_loras = 8;
  s.max_rank = 16;
  s.y = y;
  EXPECT_EQ(describe_lora_shrink_plan(s), "fused_wk/bm64/sk264");
  EXPECT_EQ(describe_lora_shrink_plan(s, ShrinkKernel::legacy), "mma/bn16/splitk2");

  LoraExpandArgs e;
  e.num_tokens = 8192;
  e.x = aligned_ptr();
  e.num_slices = 3;
  const int64_t w[3] = {4096, 1024, 1024};
  for (int i = 0; i < 3; ++i) {
    e.lora_b[i] = aligned_ptr();
    e.slice_width[i] = w[i];
  }
  e.max_loras = 8;
  e.max_rank = 16;
  e.y = y;
  e.y_row_stride = 6144;
  EXPECT_EQ(describe_lora_expand_plan(e), "pipe/bm64/bn128/bk16");
  EXPECT_EQ(describe_lora_expand_plan(e, ExpandPrefillKernel::mma_staged), "staged");

  AddLoraLinearArgs l;
  l.num_tokens = 8192;
  l.hidden = 4096;
  l.x = aligned_ptr();
  l.num_slices = 3;
  for (int i = 0; i < 3; ++i) {
    l.lora_a[i] = aligned_ptr();
    l.lora_b[i] = aligned_ptr();
    l.slice_width[i] = w[i];
  }
  l.max_loras = 8;
  l.max_rank = 16;
  l.y = y;
  l.workspace = y;
  EXPECT_EQ(describe_add_lora_linear_plan(l), "tiles:fused_wk/bm64/sk264+pipe/bm64/bn128/bk16");
  l.num_tokens = 16;
  EXPECT_EQ(describe_add_lora_linear_plan(l), "decode:decode/token+decode");

  AddLoraEmbeddingArgs em;
  em.num_tokens = 8192;
  em.embed_dim = 4096;
  em.vocab_size = 32000;
  em.max_loras = 8;
  em.max_rank = 16;
  em.token_ids = static_cast<const int32_t*>(aligned_ptr());
  em.lora_a = em.lora_b = aligned_ptr();
  em.lora_ranks = static_cast<const int32_t*>(aligned_ptr());
  em.meta = fake_meta();
  em.y = y;
  em.y_row_stride = 4096;
  EXPECT_EQ(describe_add_lora_embedding_plan(em), "pipe/bm64/bk16");
  em.num_tokens = 8;
  EXPECT_EQ(describe_add_lora_embedding_plan(em), "sorted_expand/tm4/th64");

  AddLoraLogitsArgs lg;
  lg.num_rows = 256;
  lg.hidden = 4096;
  lg.vocab_size = 128256;
  lg.max_loras = 8;
  lg.max_rank = 16;
  lg.x = lg.lora_a = lg.lora_b = aligned_ptr();
  lg.lora_ranks = static_cast<const int32_t*>(aligned_ptr());
  lg.meta = fake_meta();
  lg.y = lg.workspace = y;
  lg.y_row_stride = 128256;
  EXPECT_EQ(describe_add_lora_logits_plan(lg), "row_dot/opb8+pipe/bm64/bk16");

  ApplyLoraFullLinearArgs fl;
  fl.num_rows = 4;
  fl.in_features = 4096;
  fl.out_features = 2;
  fl.max_loras = 4;
  EXPECT_EQ(describe_apply_lora_full_linear_plan(fl), "row_dot/opb1");
  fl.num_rows = 0;
  EXPECT_EQ(describe_apply_lora_full_linear_plan(fl), "none");
}

}  // namespace
}  // namespace punica::kernels
