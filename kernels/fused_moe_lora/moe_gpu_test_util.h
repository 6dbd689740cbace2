// Device side of the MoE LoRA GPU tests: a MoeProblem's inputs uploaded, int32 / 16-bit outputs
// with guard regions on both sides (canary patterns that must survive every launch).
#pragma once
#include <gtest/gtest.h>
#include <cstring>
#include <vector>
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_buffer.h"
#include "kernels/fused_moe_lora/moe_test_util.h"

namespace punica::kernels::moetest {

constexpr std::size_t kGuardBytes = 256;

// A device copy of `bytes` host bytes between two guard regions of 0xA5.
struct GuardedBuf {
  DeviceBuffer buf;
  std::size_t bytes = 0;
  GuardedBuf() = default;
  GuardedBuf(const void* host, std::size_t n) : buf(n + 2 * kGuardBytes), bytes(n) {
    std::vector<uint8_t> all(n + 2 * kGuardBytes, 0xA5);
    if (n) std::memcpy(all.data() + kGuardBytes, host, n);
    buf.upload(all.data(), all.size());
  }
  void* ptr() const { return static_cast<uint8_t*>(buf.get()) + kGuardBytes; }
  template <class T> T* as() const { return static_cast<T*>(ptr()); }
  // Copies the payload back into `host`; false when a guard byte changed.
  bool download(void* host) const {
    std::vector<uint8_t> all(bytes + 2 * kGuardBytes);
    buf.download(all.data(), all.size());
    bool ok = true;
    for (std::size_t i = 0; i < kGuardBytes; ++i)
      ok = ok && all[i] == 0xA5 && all[bytes + kGuardBytes + i] == 0xA5;
    if (bytes) std::memcpy(host, all.data() + kGuardBytes, bytes);
    return ok;
  }
};
inline GuardedBuf guarded(const std::vector<int32_t>& v) { return GuardedBuf(v.data(), v.size() * 4); }
inline GuardedBuf guarded(const Tensor& t) { return GuardedBuf(t.data(), t.nbytes()); }
inline GuardedBuf guarded(const std::vector<float>& v) { return GuardedBuf(v.data(), v.size() * 4); }

// Inputs of a MoeProblem on the device (read-only ones guarded too: cheap, and a stray write shows).
struct DeviceProblem {
  GuardedBuf x, w, topk, map, enabled, ranks, lora_ids, emap;
  std::vector<GuardedBuf> A, B;
  explicit DeviceProblem(const MoeProblem& p)
      : x(guarded(p.x)), w(guarded(p.w)), topk(guarded(p.topk)), map(guarded(p.map)), enabled(guarded(p.enabled)),
        ranks(guarded(p.ranks)), lora_ids(guarded(p.lora_ids)), emap(guarded(p.emap)) {
    for (const auto& a : p.A) A.push_back(guarded(a));
    for (const auto& b : p.B) B.push_back(guarded(b));
  }
  // p.args with every input pointer on the device.
  FusedMoeLoraArgs args(const MoeProblem& p, void* y) const {
    FusedMoeLoraArgs a = p.args(y);
    a.x = x.ptr();
    a.topk_weights = w.as<float>();
    for (int s = 0; s < p.c.S; ++s) {
      a.lora_a[s] = A[std::size_t(s)].ptr();
      a.lora_b[s] = B[std::size_t(s)].ptr();
    }
    a.lora_ranks = ranks.as<int32_t>();
    a.token_lora_mapping = map.as<int32_t>();
    a.adapter_enabled = enabled.as<int32_t>();
    return a;
  }
  MoeLoraAlignArgs align_args(const MoeProblem& p) const {
    MoeLoraAlignArgs a = p.align_args();
    a.topk_ids = topk.as<int32_t>();
    a.token_lora_mapping = map.as<int32_t>();
    a.expert_map = p.c.expert_map ? emap.as<int32_t>() : nullptr;
    a.adapter_enabled = enabled.as<int32_t>();
    a.lora_ids = p.c.lora_ids_mode == 0 ? nullptr : lora_ids.as<int32_t>();
    return a;
  }
  bool inputs_intact() const {
    bool ok = true;
    std::vector<uint8_t> tmp;
    for (const GuardedBuf* g : {&x, &w, &topk, &map, &enabled, &ranks, &lora_ids, &emap}) {
      tmp.resize(g->bytes + 1);
      ok = g->download(tmp.data()) && ok;
    }
    for (const auto* v : {&A, &B})
      for (const auto& g : *v) {
        tmp.resize(g.bytes + 1);
        ok = g.download(tmp.data()) && ok;
      }
    return ok;
  }
};

}  // namespace punica::kernels::moetest
