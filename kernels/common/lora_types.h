// Shared pieces of every LoRA op contract: the slice limit and the view of vLLM's LoRAKernelMeta
// (tokens sorted by adapter slot). Pointers live where the backend keeps its tensors (host for the
// CPU backend, device for CUDA).
#pragma once
#include <cstdint>

namespace punica::kernels {

constexpr int kMaxSlices = 8;  // qkv = 3, gate_up = 2, variable-slice merged column up to 8

// 16-byte alignment of a tensor base (the vector paths of the kernels' launchers).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// vLLM LoRAKernelMeta (lora_kernel_metadata.py). L = max_loras. All int32.
struct LoraMetaView {
  const int32_t* token_lora_mapping = nullptr;    // [T] slot of token t, -1 = no LoRA
  const int32_t* sorted_token_ids = nullptr;      // [T] tokens stably sorted by slot (-1 first)
  const int32_t* active_lora_ids = nullptr;       // [L+1] sorted unique slots present, tail -1
  const int32_t* num_tokens_per_lora = nullptr;   // [L+1] tokens of active_lora_ids[i], tail 0
  const int32_t* lora_token_start_loc = nullptr;  // [L+2] exclusive prefix sum of the counts
  const int32_t* no_lora_flag = nullptr;          // [1] 1 when every token is -1
  const int32_t* num_active = nullptr;            // [1] number of unique values (incl. -1)
};

// The adapters the launch rules plan for: `num_active_loras` when the caller gives it (a host-side
// upper bound on the distinct adapters the batch uses: vLLM's num_active_loras, which its model
// runner takes from the batch's requests since vllm-project/vllm#32005 and passes to the LoRA
// kernels' grids), else every slot. The kernels' choices (which kernel, tile, split) and their grids
// (the metadata entries that can hold tokens: this + 1 for the -1 entry) follow it, so a batch that
// uses MORE distinct adapters than the hint breaks the contract: the tokens of the entries past the
// grid are left out, as in vLLM. The metadata lists the active entries first (lora_meta), which is
// what lets a grid stop at this bound. Slot ids and lora_ranks still span max_loras.
inline int planned_loras(int max_loras, int num_active_loras) {
  return num_active_loras > 0 && num_active_loras < max_loras ? num_active_loras : max_loras;
}

// Upper bound of the token tiles of bm rows that the tile lookup (lora_dev::find_tile) can return
// over `entries` metadata entries holding at most T tokens in all: each non-empty entry starts a
// tile, so sum ceil(n_i / bm) <= (T + min(entries, T) * (bm - 1)) / bm. At least 1 (a launch needs a
// block). Tighter than ceil(T / bm) + entries (up to a whole bm-row tile per entry fewer), so
// fewer blocks of the grid find no tile and only return.
inline int64_t token_tile_bound(int64_t T, int64_t entries, int bm) {
  const int64_t e = entries < T ? entries : T;
  const int64_t b = (T + (e > 0 ? e : 0) * (bm - 1)) / bm;
  return b > 1 ? b : 1;
}

}  // namespace punica::kernels
