// LoRAKernelMeta.prepare_tensors on the device: per-token slot -> tokens stably sorted by slot,
// the sorted unique active slots, their token counts and start offsets, the no-LoRA flag.
// Chosen semantics (SPEC box): the mapping copy is always refreshed, also for a no-LoRA batch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <cuda_runtime_api.h>
#include "kernels/common/lora_types.h"

namespace punica::kernels {

struct LoraMetaArgs {
  int64_t num_tokens = 0;                  // T (may be 0)
  int max_loras = 0;                       // L
  const int32_t* token_lora_mapping_in = nullptr;  // [T] slot per token, -1 = none, < L
  // outputs (sizes as in LoraMetaView; buffers sized for max_tokens / L)
  int32_t* token_lora_mapping = nullptr;
  int32_t* sorted_token_ids = nullptr;
  int32_t* active_lora_ids = nullptr;
  int32_t* num_tokens_per_lora = nullptr;
  int32_t* lora_token_start_loc = nullptr;
  int32_t* no_lora_flag = nullptr;
  int32_t* num_active = nullptr;
  void* workspace = nullptr;               // lora_meta_workspace_bytes(max_tokens, L) bytes
  std::size_t workspace_bytes = 0;

  LoraMetaView view() const {
    return {token_lora_mapping, sorted_token_ids, active_lora_ids, num_tokens_per_lora,
            lora_token_start_loc, no_lora_flag, num_active};
  }
};

// Temporary storage for the device implementation (CUB sort/scan), allocated once up front.
std::size_t lora_meta_workspace_bytes(int64_t max_tokens, int max_loras);
// Asynchronous on `stream`; no host synchronisation or allocation (graph capturable).
void launch_lora_meta(const LoraMetaArgs& args, cudaStream_t stream);
// The kernels launch_lora_meta(a) runs: "single" (one block sorts every token, T <= 2048) or
// "chunked/nb<blocks>" (histogram, scan and scatter over blocks of 2048 tokens). Host only.
std::string describe_lora_meta_plan(const LoraMetaArgs& a);

}  // namespace punica::kernels
