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
void launch_impl(const AddLoraLinearArgs& a, detail::LinearPath path, cudaStream_t stream) {
  using P = detail::LinearPath;
  PUNICA_REQUIRE(a.num_slices >= 1 && a.num_slices <= kMaxSlices, ErrorKind::usage,
                 "add_lora_linear: num_slices must be in [1, 8]");
  PUNICA_REQUIRE(a.num_active_loras >= 0, ErrorKind::usage,
                 "add_lora_linear: num_active_loras must be >= 0 (0 = not given)");
  if (a.num_tokens == 0 || a.max_loras == 0) return;
  PUNICA_REQUIRE(a.workspace != nullptr || a.max_rank == 0, ErrorKind::usage,
                 "add_lora_linear: workspace missing");
  LoraShrinkArgs sa;
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
  LoraExpandArgs ea;
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

  // Choices plan for the adapters the batch can use (planned_loras: the caller's hint, else every slot).
  const int lh = planned_loras(a.max_loras, a.num_active_loras);
  const bool small = linear_heur::use_partials(a.num_tokens);
  if (!small && (path == P::decode || path == P::partials)) path = P::automatic;
  const bool auto_tiles = linear_heur::use_tiles(a.num_tokens, lh, a.max_rank);
  if (path == P::automatic) {
    if (auto_tiles)
      path = P::tiles;
    else if (linear_heur::use_split_partials(a.num_tokens, lh, a.max_rank, a.hidden, a.num_slices, total))
      path = P::partials;
    else
      path = P::decode;
  }
  if (path == P::partials) {
    const int nsplit = detail::launch_shrink_partials(sa, static_cast<float*>(a.workspace), stream);
    detail::launch_expand_from_partials(ea, static_cast<const float*>(a.workspace), nsplit, stream);
  } else if (path == P::decode) {
    // Both kernels are programmatic dependents: each one's launch and its metadata / rank (and the
    // expand's B) loads overlap its predecessor's tail; each waits (griddepcontrol.wait) before
    // reading x or touching y (preconditions in shrink_decode.h / expand_decode.h).
    detail::launch_shrink_decode(sa, stream);
    if (a.max_rank <= expand_heur::kDecMaxRank) {
      detail::launch_expand_decode(ea, stream);
    } else {
      launch_lora_expand(ea, stream);
    }
  } else if ((small ? auto_tiles && linear_heur::small_cluster_pdl_expand(a.num_tokens, a.num_slices, a.max_rank, lh)
                   : linear_heur::mid_cluster(a.num_tokens, a.num_slices, a.max_rank, lh, a.hidden)) &&
             detail::shrink_cluster_ok(sa)) {
    // The cluster shrink as a programmatic dependent of the kernel before it, whose CTAs trigger
    // their own dependents only after their griddepcontrol.wait (late_trigger), then the expand as
    // its programmatic dependent: the shrink's launch and metadata loads overlap the kernel before
    // it, and the expand's y and B loads, issued before its own wait, overlap the shrink; the
    // expand launches only once that kernel has finished, so it cannot see y before its writes.
    detail::launch_shrink_cluster(sa, stream, true);
    detail::launch_lora_expand_after_shrink(ea, stream);
  } else if (!small) {
    // The fused / atomic kernels, which start behind an ordinary launch (the zero kernel, or the
    // shrink itself), so the expand may load y early.
    launch_lora_shrink_with(sa, ShrinkKernel::small_cluster, stream);
    detail::launch_lora_expand_after_shrink(ea, stream);  // PDL: overlaps the shrink's tail
  } else {
    // Decode-sized batch through the mma expand: B read once per adapter instead of once per
    // token. The small-batch shrink may itself be a programmatic dependent of the kernel before
    // it, so the expand must not read y before the whole chain is done: it is lora_expand's
    // standalone launch, a programmatic dependent that reads only the metadata and the ranks
    // before its griddepcontrol.wait (for the shrink's completion). Every shrink block with tokens
    // waits for the kernel before it first, and the expand has work only where the shrink had, so
    // that kernel is done too before the expand touches y.
    // Where the automatic rule took this path the expand's own small-batch choice applies (the
    // streaming kernel above rank 16); an explicit `tiles` at other sizes forces the mma kernel.
    launch_lora_shrink_with(sa, ShrinkKernel::small_cluster, stream);
    launch_lora_expand_with(
        ea, auto_tiles ? ExpandPrefillKernel::automatic : ExpandPrefillKernel::mma_pipe, stream);
  }
}
}  // namespace

void launch_add_lora_linear(const AddLoraLinearArgs& a, cudaStream_t stream) {
  launch_impl(a, detail::LinearPath::automatic, stream);
}

namespace detail {
void launch_add_lora_linear_with(const AddLoraLinearArgs& a, LinearPath path, cudaStream_t stream) {
  launch_impl(a, path, stream);
}
}  // namespace detail

}  // namespace punica::kernels
