// vLLM add_lora_linear: y[t, c_s : c_s + N_s] (+)= scale * B_s[l] @ (A_s[l] @ x[t]) for every
// slice s (c_s cumulative from 0), tokens with slot -1 untouched. Numerically shrink (fp32, scaled)
// then expand (intermediate rounded to the weight dtype); the implementation may fuse them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"
#include "kernels/common/lora_types.h"

namespace punica::kernels {

struct AddLoraLinearArgs {
  DType dtype = DType::bf16;      // x, A, B, y
  int64_t num_tokens = 0;
  int64_t hidden = 0;             // K
  const void* x = nullptr;        // [T, K]
  int64_t x_row_stride = 0;
  int num_slices = 1;
  const void* lora_a[kMaxSlices] = {};   // [L, max_rank, K]
  const void* lora_b[kMaxSlices] = {};   // [L, N_s, max_rank]
  int64_t slice_width[kMaxSlices] = {};
  int max_loras = 0;
  int max_rank = 0;
  int num_active_loras = 0;       // 0 = unknown; else an upper bound on the distinct adapters the
                                  // batch uses (planned_loras, kernels/common/lora_types.h)
  const int32_t* lora_ranks = nullptr;
  LoraMetaView meta;
  float scale = 1.0f;
  void* y = nullptr;              // [T, >= sum N_s]
  int64_t y_row_stride = 0;
  bool add_inputs = true;
  void* workspace = nullptr;      // add_lora_linear_workspace_bytes(...) bytes, caller-owned
};

std::size_t add_lora_linear_workspace_bytes(int64_t max_tokens, int num_slices, int max_rank);
void launch_add_lora_linear(const AddLoraLinearArgs& args, cudaStream_t stream);

// The plan launch_add_lora_linear(a) runs (kernels/add_lora_linear/heuristics.h: the chain of
// kernels and the plans of its shrink and expand), from a's sizes, dtypes and pointer alignment and
// the current device (SM count, clusters, wgmma; cached per device; without a GPU: 132 SMs and
// neither). No device memory is read.
struct LinearPlan;
LinearPlan add_lora_linear_plan(const AddLoraLinearArgs& a);
// A short stable name, e.g. "tiles:cluster/bm16/nbw2/c4+pipe/bm64/bn128/bk16", "partials/splitk16".
std::string plan_name(const LinearPlan& p);
// plan_name(add_lora_linear_plan(a)).
std::string describe_add_lora_linear_plan(const AddLoraLinearArgs& a);

}  // namespace punica::kernels
