// vLLM add_lora_linear: y[t, c_s : c_s + N_s] (+)= scale * B_s[l] @ round_w(A_s[l] @ x[t]).
// Decode: the one-kernel shrink (every element of the fp32 workspace written, no memset, no
// atomics) -> (PDL) the decode expand reading it.
// Prefill: the shrink (mma) into the fp32 workspace, then the expand (mma) reading it. The shrink
// is lora_shrink's automatic choice with its cluster tile only for small batches
// (ShrinkKernel::small_cluster; shrink_heur::auto_cluster says why) and, from 129 tokens, where
// linear_heur::mid_cluster says.
#include "kernels/add_lora_linear/add_lora_linear.h"
#include "kernels/add_lora_linear/add_lora_linear_internal.h"
#include "kernels/add_lora_linear/heuristics.h"
#include "kernels/common/error.h"
#include "kernels/common/lora_types.h"
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/lora_expand/expand_decode.h"
#include "kernels/lora_expand/heuristics.h"
#include "kernels/lora_expand/lora_expand_internal.h"
#include "kernels/lora_shrink/lora_shrink.h"
#include "kernels/lora_shrink/lora_shrink_internal.h"
#include "kernels/lora_shrink/shrink_decode.h"

namespace punica::kernels {

std::size_t add_lora_linear_workspace_bytes(int64_t max_tokens, int num_slices, int max_rank) {
  return linear_heur::workspace_bytes(max_tokens, num_slices, max_rank);
}

namespace {
// The shrink's and the expand's arguments of one call (the workspace between them).
void sub_args(const AddLoraLinearArgs& a, LoraShrinkArgs& sa, LoraExpandArgs& ea) {
  sa.dtype = a.dtype;
  sa.out_dtype = DType::f32;
  sa.num_tokens = a.num_tokens;
  sa.hidden = a.hidden;
  sa.x = a.x;
  sa.x_row_stride = a.x_row_stride ? a.x_row_stride : a.hidden;
  sa.num_slices = a.num_slices;
  sa.max_loras = a.max_loras;
  sa.num_active_loras = a.num_active_loras;
  sa.max_rank = a.max_rank;
  sa.lora_ranks = a.lora_ranks;
  sa.meta = a.meta;
  sa.scale = a.scale;
  sa.y = a.workspace;
  ea.in_dtype = DType::f32;
  ea.dtype = a.dtype;
  ea.num_tokens = a.num_tokens;
  ea.x = a.workspace;
  ea.num_slices = a.num_slices;
  int64_t total = 0;
  for (int s = 0; s < kMaxSlices; ++s) {
    sa.lora_a[s] = a.lora_a[s];
    ea.lora_b[s] = a.lora_b[s];
    ea.slice_width[s] = s < a.num_slices ? a.slice_width[s] : 0;
    total += ea.slice_width[s];
  }
  ea.max_loras = a.max_loras;
  ea.num_active_loras = a.num_active_loras;
  ea.max_rank = a.max_rank;
  ea.lora_ranks = a.lora_ranks;
  ea.meta = a.meta;
  ea.y = a.y;
  ea.y_row_stride = a.y_row_stride ? a.y_row_stride : total;
  ea.offset_start = 0;
  ea.add_inputs = a.add_inputs;
}

LinearPlan plan_with(const AddLoraLinearArgs& a, detail::LinearPath path, const LoraShrinkArgs& sa,
                     const LoraExpandArgs& ea) {
  LinearShape s;
  s.T = a.num_tokens;
  s.K = a.hidden;
  s.S = a.num_slices;
  s.R = a.max_rank;
  s.L = a.max_loras;
  s.planned = planned_loras(a.max_loras, a.num_active_loras);
  for (int i = 0; i < kMaxSlices; ++i) s.total_n += ea.slice_width[i];
  const bool slices_ok = a.num_slices >= 1 && a.num_slices <= kMaxSlices;
  s.cluster_ok = slices_ok && detail::shrink_cluster_ok(sa);
  LinearPlan p;
  p.chain = linear_heur::plan_chain(s, path);
  switch (p.chain) {
    case LinearChain::none: break;
    case LinearChain::partials: p.nsplit = detail::shrink_partials_nsplit(a.hidden); break;
    case LinearChain::decode:
      p.shrink.path = ShrinkPath::decode;
      p.shrink.per_token = shrink_heur::decode_per_token(a.num_tokens, a.max_loras);
      if (a.max_rank <= expand_heur::kDecMaxRank) p.expand.path = ExpandPath::decode;
      else p.expand = lora_expand_plan(ea);
      break;
    case LinearChain::cluster:
      p.shrink.path = ShrinkPath::cluster;
      p.shrink.cluster = shrink_heur::cluster_config(a.num_tokens, a.hidden, a.num_slices, a.max_rank, s.planned,
                                                     detail::num_sms_cached());
      p.expand = detail::plan_expand(ea, ExpandPrefillKernel::automatic, true);
      break;
    case LinearChain::tiles:
      p.shrink = lora_shrink_plan(sa, ShrinkKernel::small_cluster);
      p.expand = detail::plan_expand(ea, ExpandPrefillKernel::automatic, true);
      break;
    case LinearChain::small_tiles:
      // Where the automatic rule took this path the expand's own small-batch choice applies (the
      // streaming kernel above rank 16); an explicit `tiles` at other sizes forces the mma kernel.
      p.shrink = lora_shrink_plan(sa, ShrinkKernel::small_cluster);
      p.expand_kind = linear_heur::use_tiles(a.num_tokens, s.planned, a.max_rank) ? ExpandPrefillKernel::automatic
                                                                                  : ExpandPrefillKernel::mma_pipe;
      p.expand = lora_expand_plan(ea, p.expand_kind);
      break;
  }
  return p;
}

void launch_impl(const AddLoraLinearArgs& a, detail::LinearPath path, cudaStream_t stream) {
  PUNICA_REQUIRE(a.num_slices >= 1 && a.num_slices <= kMaxSlices, ErrorKind::usage,
                 "add_lora_linear: num_slices must be in [1, 8]");
  PUNICA_REQUIRE(a.num_active_loras >= 0, ErrorKind::usage,
                 "add_lora_linear: num_active_loras must be >= 0 (0 = not given)");
  if (a.num_tokens == 0 || a.max_loras == 0) return;
  PUNICA_REQUIRE(a.workspace != nullptr || a.max_rank == 0, ErrorKind::usage,
                 "add_lora_linear: workspace missing");
  LoraShrinkArgs sa;
  LoraExpandArgs ea;
  sub_args(a, sa, ea);
  const LinearPlan pl = plan_with(a, path, sa, ea);
  switch (pl.chain) {
    case LinearChain::none: return;
    case LinearChain::partials: {
      const int nsplit = detail::launch_shrink_partials(sa, static_cast<float*>(a.workspace), stream);
      detail::launch_expand_from_partials(ea, static_cast<const float*>(a.workspace), nsplit, stream);
      return;
    }
    case LinearChain::decode:
      // Both kernels are programmatic dependents: each one's launch and its metadata / rank (and the
      // expand's B) loads overlap its predecessor's tail; each waits (griddepcontrol.wait) before
      // reading x or touching y (preconditions in shrink_decode.h / expand_decode.h).
      detail::launch_shrink_decode(sa, pl.shrink.per_token, stream);
      if (pl.expand.path == ExpandPath::decode) detail::launch_expand_decode(ea, stream);
      else launch_lora_expand(ea, stream);
      return;
    case LinearChain::cluster:
      // The cluster shrink as a programmatic dependent of the kernel before it, whose CTAs trigger
      // their own dependents only after their griddepcontrol.wait (late_trigger), then the expand as
      // its programmatic dependent: the shrink's launch and metadata loads overlap the kernel before
      // it, and the expand's y and B loads, issued before its own wait, overlap the shrink; the
      // expand launches only once that kernel has finished, so it cannot see y before its writes.
      detail::launch_shrink_cluster(sa, pl.shrink.cluster, stream, true);
      detail::launch_lora_expand_after_shrink(ea, stream);
      return;
    case LinearChain::tiles:
      // The fused / atomic kernels, which start behind an ordinary launch (the zero kernel, or the
      // shrink itself), so the expand may load y early.
      launch_lora_shrink_with(sa, ShrinkKernel::small_cluster, stream);
      detail::launch_lora_expand_after_shrink(ea, stream);  // PDL: overlaps the shrink's tail
      return;
    case LinearChain::small_tiles:
      // Decode-sized batch through the mma expand: B read once per adapter instead of once per
      // token. The small-batch shrink may itself be a programmatic dependent of the kernel before
      // it, so the expand must not read y before the whole chain is done: it is lora_expand's
      // standalone launch, a programmatic dependent that reads only the metadata and the ranks
      // before its griddepcontrol.wait (for the shrink's completion). Every shrink block with tokens
      // waits for the kernel before it first, and the expand has work only where the shrink had, so
      // that kernel is done too before the expand touches y.
      launch_lora_shrink_with(sa, ShrinkKernel::small_cluster, stream);
      launch_lora_expand_with(ea, pl.expand_kind, stream);
      return;
  }
}
}  // namespace

LinearPlan add_lora_linear_plan(const AddLoraLinearArgs& a) {
  LoraShrinkArgs sa;
  LoraExpandArgs ea;
  sub_args(a, sa, ea);
  return plan_with(a, detail::LinearPath::automatic, sa, ea);
}

std::string plan_name(const LinearPlan& p) {
  switch (p.chain) {
    case LinearChain::none: return "none";
    case LinearChain::partials: return "partials/splitk" + std::to_string(p.nsplit);
    case LinearChain::decode: return "decode:" + plan_name(p.shrink) + "+" + plan_name(p.expand);
    case LinearChain::cluster:
    case LinearChain::tiles:
    case LinearChain::small_tiles: return "tiles:" + plan_name(p.shrink) + "+" + plan_name(p.expand);
  }
  return "?";
}

std::string describe_add_lora_linear_plan(const AddLoraLinearArgs& a) { return plan_name(add_lora_linear_plan(a)); }

void launch_add_lora_linear(const AddLoraLinearArgs& a, cudaStream_t stream) {
  launch_impl(a, detail::LinearPath::automatic, stream);
}

namespace detail {
void launch_add_lora_linear_with(const AddLoraLinearArgs& a, LinearPath path, cudaStream_t stream) {
  launch_impl(a, path, stream);
}
}  // namespace detail

}  // namespace punica::kernels
