// PunicaWrapper.apply_lora_full_linear (modules_to_save classifier heads): rows j with
// idx = sampler slot >= 0 and module_enabled[idx] are REPLACED by W[idx] @ x[j] + b[idx] (cast to
// y's dtype); all other rows keep the base output (vLLM _select_full_linear_output).
#pragma once
#include <cstdint>
#include <string>
#include <cuda_runtime_api.h>
#include "kernels/common/dtype.h"
#include "kernels/common/lora_types.h"

namespace punica::kernels {

struct ApplyLoraFullLinearArgs {
  DType dtype = DType::bf16;      // x, W, bias, y
  int64_t num_rows = 0;           // R
  int64_t in_features = 0;
  int64_t out_features = 0;
  const void* x = nullptr;        // [R, in]
  int64_t x_row_stride = 0;
  const void* weight = nullptr;   // [L, out, in]
  const void* bias = nullptr;     // [L, out] or nullptr (no bias)
  const int32_t* module_enabled = nullptr;  // [L], 0/1
  int max_loras = 0;
  LoraMetaView meta;              // prompt/sampler-level
  void* y = nullptr;              // [R, >= out]
  int64_t y_row_stride = 0;
};

void launch_apply_lora_full_linear(const ApplyLoraFullLinearArgs& args, cudaStream_t stream);
// The kernel launch_apply_lora_full_linear(a) runs: "row_dot/opb<outputs per block>" (from the
// current device's SM count, 132 without a GPU), or "none". Host only.
std::string describe_apply_lora_full_linear_plan(const ApplyLoraFullLinearArgs& a);

}  // namespace punica::kernels
