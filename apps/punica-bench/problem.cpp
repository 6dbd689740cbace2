// The parts of problem.h shared by every registry entry (apps/punica-bench/ops/*.cpp): the default
// tolerance and the LoRAKernelMeta tensors' Args and View.
#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/ops/op_kit.h"

namespace punica::bench {

double Problem::rtol() const { return default_rtol(dtype); }

kernels::LoraMetaArgs MetaTensors::args(const std::vector<void*>& p) const {
  kernels::LoraMetaArgs a;
  a.num_tokens = T;
  a.max_loras = L;
  a.token_lora_mapping_in = static_cast<const int32_t*>(p[std::size_t(mapping)]);
  a.token_lora_mapping = static_cast<int32_t*>(p[std::size_t(tlm)]);
  a.sorted_token_ids = static_cast<int32_t*>(p[std::size_t(sorted)]);
  a.active_lora_ids = static_cast<int32_t*>(p[std::size_t(active)]);
  a.num_tokens_per_lora = static_cast<int32_t*>(p[std::size_t(counts)]);
  a.lora_token_start_loc = static_cast<int32_t*>(p[std::size_t(start)]);
  a.no_lora_flag = static_cast<int32_t*>(p[std::size_t(nolora)]);
  a.num_active = static_cast<int32_t*>(p[std::size_t(nactive)]);
  a.workspace = ws >= 0 ? p[std::size_t(ws)] : nullptr;
  a.workspace_bytes = ws >= 0 ? ws_bytes : 0;
  return a;
}

kernels::LoraMetaView MetaTensors::view(const std::vector<void*>& p) const {
  kernels::LoraMetaView v;
  v.token_lora_mapping = static_cast<const int32_t*>(p[std::size_t(tlm)]);
  v.sorted_token_ids = static_cast<const int32_t*>(p[std::size_t(sorted)]);
  v.active_lora_ids = static_cast<const int32_t*>(p[std::size_t(active)]);
  v.num_tokens_per_lora = static_cast<const int32_t*>(p[std::size_t(counts)]);
  v.lora_token_start_loc = static_cast<const int32_t*>(p[std::size_t(start)]);
  v.no_lora_flag = static_cast<const int32_t*>(p[std::size_t(nolora)]);
  v.num_active = static_cast<const int32_t*>(p[std::size_t(nactive)]);
  return v;
}

}  // namespace punica::bench
