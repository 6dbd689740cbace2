// Internal entry points of lora_shrink used by add_lora_linear's fused decode path: the split-K
// GEMV that writes per-split fp32 partials (scaled) instead of atomically adding into y.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>
#include "kernels/lora_shrink/heuristics.h"
#include "kernels/lora_shrink/lora_shrink.h"

namespace punica::kernels::detail {

// partials: [nsplit, S, T, max_rank] fp32; only rows j < lora_ranks[slot] of tokens with a slot
// are written. Returns nsplit (a function of K alone, see shrink_heur::gemv_config).
int launch_shrink_partials(const LoraShrinkArgs& a, float* partials, cudaStream_t stream);
int shrink_partials_nsplit(int64_t K);

// The current device's SM count (cached per device; 132 where it cannot be read).
int num_sms_cached();
const PlanningDevice* planning_device_override();  // set_planning_device_override's (nullptr: none)
// Thread-block clusters can be launched on the current device (sm_90 and later).
bool cluster_available();
// The cluster tile takes this call (dtypes, alignment, ranks, device); launch_shrink_cluster requires it.
bool shrink_cluster_ok(const LoraShrinkArgs& a);
// Launched as a programmatic dependent of the kernel before it on the stream (griddepcontrol.wait
// before x is read). late_trigger: its own dependents may launch only once every CTA has passed that
// wait, i.e. once the kernel before it has finished, so that a dependent may read what that kernel
// wrote before its own wait (add_lora_linear's expand, which loads y early); without it such a
// dependent could see y before the kernel before the shrink wrote it.
void launch_shrink_cluster(const LoraShrinkArgs& a, cudaStream_t stream, bool late_trigger = false);
// The same with configuration c (the plan's; the overload above computes shrink_heur::cluster_config).
void launch_shrink_cluster(const LoraShrinkArgs& a, const shrink_heur::ClusterConfig& c, cudaStream_t stream,
                           bool late_trigger = false);

}  // namespace punica::kernels::detail
