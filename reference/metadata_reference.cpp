// vLLM metadata on the host: convert_mapping (SPEC §2.2), compute_meta (SPEC §2.4) and
// LoRAKernelMeta.prepare_tensors (SPEC §2.5, with the chosen semantics: the mapping copy is always
// refreshed). naive::lora_meta lives in naive_reference.cpp and is written independently.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "reference/lora_reference.h"

namespace punica::ref {

namespace {

// slot = first index of `id` in lora_index_to_id (Python list.index); throws when absent.
int32_t slot_of_id(int64_t id, const std::vector<std::optional<int64_t>>& lora_index_to_id,
                   const char* what) {
  for (std::size_t i = 0; i < lora_index_to_id.size(); ++i)
    if (lora_index_to_id[i].has_value() && *lora_index_to_id[i] == id) return int32_t(i);
  throw Error(ErrorKind::usage, std::string("convert_mapping: ") + what + " adapter id " +
                                    std::to_string(id) + " is not loaded in any slot");
}

}  // namespace

ConvertMappingResult convert_mapping(const std::vector<int64_t>& index_mapping,
                                     const std::vector<int64_t>& prompt_mapping,
                                     const std::vector<std::optional<int64_t>>& lora_index_to_id,
                                     int max_loras_arg, int64_t vocab_size) {
  PUNICA_REQUIRE(vocab_size >= 0, ErrorKind::usage, "convert_mapping: negative vocab_size");
  const std::size_t T = index_mapping.size(), R = prompt_mapping.size();
  ConvertMappingResult out;
  out.base_indices.resize(T);
  out.embeddings_indices.resize(T);
  for (std::size_t t = 0; t < T; ++t) {
    const int64_t u = index_mapping[t];
    // vLLM: lora_index_to_id.index(u) if u > 0 else -1 (ids <= 0 mean "no LoRA").
    const int32_t slot = u > 0 ? slot_of_id(u, lora_index_to_id, "token") : -1;
    out.base_indices[t] = slot;
    out.embeddings_indices[t] = int64_t(slot >= 0 ? slot : 0) * vocab_size;
  }
  out.sampler_indices.resize(R);
  out.sampler_indices_padded.resize(R);
  for (std::size_t j = 0; j < R; ++j) {
    const int64_t p = prompt_mapping[j];
    const int32_t slot = p > 0 ? slot_of_id(p, lora_index_to_id, "prompt") : -1;
    out.sampler_indices[j] = slot;
    const int64_t s = slot >= 0 ? slot : int64_t(max_loras_arg) - 1;
    out.sampler_indices_padded[j] = int64_t(j) + s * int64_t(R);
  }
  out.indices_len = {int64_t(T), int64_t(R), int64_t(R), int64_t(T)};
  return out;
}

// Run-length encoding of consecutive equal slots. Empty input: no runs, all counts 0 and
// no_lora = false (vLLM's test `batch_size == 1 and value == -1` is false for zero runs).
ComputeMetaResult compute_meta(const std::vector<int32_t>& idx) {
  ComputeMetaResult m;
  std::size_t i = 0;
  while (i < idx.size()) {
    std::size_t j = i + 1;
    while (j < idx.size() && idx[j] == idx[i]) ++j;
    m.seq_start_locs.push_back(int64_t(i));
    m.seq_lengths.push_back(int64_t(j - i));
    m.lora_indices_per_batch.push_back(idx[i]);
    m.max_length = std::max<int64_t>(m.max_length, int64_t(j - i));
    i = j;
  }
  m.batch_size = int64_t(m.seq_lengths.size());
  m.token_nums = int64_t(idx.size());
  m.no_lora = m.batch_size == 1 && m.lora_indices_per_batch[0] == -1;
  return m;
}

// LoRAKernelMeta.prepare_tensors. Chosen semantics: the mapping copy is refreshed also for a
// batch without LoRA. T == 0 (vacuously "all -1"): no_lora_flag = 1, num_active = 0, every
// per-LoRA output at its reset value. Null output pointers are skipped.
void lora_meta(const kernels::LoraMetaArgs& a) {
  const int64_t T = a.num_tokens;
  const int L = a.max_loras;
  PUNICA_REQUIRE(T >= 0, ErrorKind::usage, "lora_meta: negative num_tokens");
  PUNICA_REQUIRE(L >= 0, ErrorKind::usage, "lora_meta: negative max_loras");
  PUNICA_REQUIRE(T == 0 || a.token_lora_mapping_in, ErrorKind::usage,
                 "lora_meta: token_lora_mapping_in is null");
  const int32_t* map = a.token_lora_mapping_in;
  for (int64_t t = 0; t < T; ++t)
    PUNICA_REQUIRE(map[t] >= -1 && map[t] < L, ErrorKind::usage,
                   "lora_meta: mapping value " + std::to_string(map[t]) + " at token " +
                       std::to_string(t) + " outside [-1, " + std::to_string(L) + ")");

  // reset
  if (a.active_lora_ids) std::fill(a.active_lora_ids, a.active_lora_ids + L + 1, -1);
  if (a.num_tokens_per_lora) std::fill(a.num_tokens_per_lora, a.num_tokens_per_lora + L + 1, 0);
  if (a.lora_token_start_loc) std::fill(a.lora_token_start_loc, a.lora_token_start_loc + L + 2, 0);

  bool no_lora = true;
  for (int64_t t = 0; t < T; ++t) no_lora = no_lora && map[t] == -1;
  if (a.no_lora_flag) *a.no_lora_flag = no_lora ? 1 : 0;
  if (a.token_lora_mapping) std::copy(map, map + T, a.token_lora_mapping);

  std::vector<int32_t> order(static_cast<std::size_t>(T));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [map](int32_t x, int32_t y) { return map[x] < map[y]; });
  if (a.sorted_token_ids) std::copy(order.begin(), order.end(), a.sorted_token_ids);

  // unique with counts over the sorted values
  std::vector<int32_t> vals, counts;
  for (int64_t i = 0; i < T; ++i) {
    const int32_t v = map[order[size_t(i)]];
    if (vals.empty() || vals.back() != v) { vals.push_back(v); counts.push_back(0); }
    ++counts.back();
  }
  int32_t run = 0;
  for (std::size_t i = 0; i < vals.size(); ++i) {
    if (a.active_lora_ids) a.active_lora_ids[i] = vals[i];
    if (a.num_tokens_per_lora) a.num_tokens_per_lora[i] = counts[i];
    run += counts[i];
    if (a.lora_token_start_loc) a.lora_token_start_loc[i + 1] = run;
  }
  if (a.num_active) *a.num_active = int32_t(vals.size());
}

}  // namespace punica::ref
