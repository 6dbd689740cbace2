// vLLM lora_shrink (add_shrink): y[s, t, :r_l] = scale * A_s[l] @ x[t] for tokens with slot l,
// zeros elsewhere. The launcher: lora_shrink_plan chooses the kernel family and its configuration
// (shrink_heur::plan, heuristics.h) and launch_impl runs that plan through the family's launcher
// (shrink_legacy.cu, shrink_fused.cu, shrink_decode.cu, shrink_cluster.cu).
#include <algorithm>
#include <atomic>
#include "kernels/common/cuda_check.h"
#include "kernels/common/error.h"
#include "kernels/lora_shrink/heuristics.h"
#include "kernels/lora_shrink/lora_device.cuh"
#include "kernels/lora_shrink/lora_shrink.h"
#include "kernels/lora_shrink/lora_shrink_internal.h"
#include "kernels/lora_shrink/shrink_decode.h"
#include "kernels/lora_shrink/shrink_launch.h"
#include "kernels/lora_shrink/shrink_params.h"

namespace punica::kernels {
namespace {
namespace H = shrink_heur;

ShrinkParams make_params(const LoraShrinkArgs& a) {
  ShrinkParams p{};
  static_cast<ShrinkCore&>(p) = shrink_core(a);
  return p;
}

void validate(const LoraShrinkArgs& a) {
  PUNICA_REQUIRE(a.num_slices >= 1 && a.num_slices <= kMaxSlices, ErrorKind::usage,
                 "lora_shrink: num_slices must be in [1, 8]");
  PUNICA_REQUIRE(a.max_loras >= 0 && a.max_rank >= 0 && a.hidden >= 0, ErrorKind::usage,
                 "lora_shrink: negative size");
  PUNICA_REQUIRE(a.max_loras + 1 <= 65535, ErrorKind::usage, "lora_shrink: max_loras too large");
  PUNICA_REQUIRE(a.num_active_loras >= 0, ErrorKind::usage, "lora_shrink: num_active_loras must be >= 0 (0 = not given)");
}

}  // namespace

namespace {
std::atomic<const PlanningDevice*> g_planning_device{nullptr};
}  // namespace
void set_planning_device_override(const PlanningDevice* d) { g_planning_device.store(d); }
namespace detail {
const PlanningDevice* planning_device_override() { return g_planning_device.load(); }
}  // namespace detail

bool wgmma_available() {
  if (const PlanningDevice* o = detail::planning_device_override()) return o->wgmma;
#if PUNICA_HAVE_SM90A
  static std::atomic<int> cache[64];  // per device: 0 unknown, 1 yes, 2 no
  return lora_dev::per_device_cached(cache, [](int dev) {
           int major = 0, minor = 0;
           if (dev < 0 || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
               cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
             cudaGetLastError();
             return 2;
           }
           return major == 9 && minor == 0 ? 1 : 2;
         }) == 1;
#else
  return false;
#endif
}

namespace detail {
int num_sms_cached() {
  if (const PlanningDevice* o = planning_device_override()) return o->num_sms;
  static std::atomic<int> cache[64];
  return lora_dev::per_device_cached(cache, [](int dev) {
    int v = 0;
    if (dev >= 0 && cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0) return v;
    cudaGetLastError();
    return 132;  // the H200's count: only a fallback, the launch itself would then fail and say why
  });
}
}  // namespace detail

namespace {

void launch_impl(const LoraShrinkArgs& a, ShrinkKernel kind, cudaStream_t stream) {
  validate(a);
  const ShrinkPlan pl = lora_shrink_plan(a, kind);
  if (pl.path == ShrinkPath::none) return;
  const int64_t n = int64_t(a.num_slices) * a.num_tokens * a.max_rank;
  const std::size_t ybytes = std::size_t(n) * dtype_size(a.out_dtype);
  if (pl.path == ShrinkPath::cluster) return detail::launch_shrink_cluster(a, pl.cluster, stream);
  if (pl.path == ShrinkPath::decode) return detail::launch_shrink_decode(a, pl.per_token, stream);
  if (pl.zero == ShrinkZero::kernel) detail::launch_shrink_zero(static_cast<float*>(a.y), n, stream);
  else if (pl.zero == ShrinkZero::memset) PUNICA_CUDA_CHECK(cudaMemsetAsync(a.y, 0, ybytes, stream));
  const ShrinkParams p = make_params(a);
  const bool vec = shrink_vec_ok(a, p);
  switch (pl.path) {
    case ShrinkPath::fused: return detail::launch_shrink_fused(p, a.dtype, pl.fused, stream);
    case ShrinkPath::mma: return detail::launch_shrink_mma(p, a.dtype, vec, pl.mma, stream);
    case ShrinkPath::gemv: return detail::launch_shrink_gemv(p, a.dtype, a.out_dtype, vec, pl.gemv, pl.pdl, stream);
    default: return;  // zero: the memset above
  }
}

std::string num(int v) { return std::to_string(v); }

}  // namespace

ShrinkPlan lora_shrink_plan(const LoraShrinkArgs& a, ShrinkKernel k) {
  ShrinkShape s;
  s.dtype = a.dtype;
  s.out_dtype = a.out_dtype;
  s.T = a.num_tokens;
  s.K = a.hidden;
  s.S = a.num_slices;
  s.R = a.max_rank;
  s.L = a.max_loras;
  s.planned = planned_loras(a.max_loras, a.num_active_loras);
  s.vec = a.num_slices >= 1 && a.num_slices <= kMaxSlices && shrink_vec_ok(a, shrink_core(a));
  ShrinkDevice d;
  d.num_sms = detail::num_sms_cached();
  d.wgmma = wgmma_available();
  d.cluster = detail::cluster_available();
  return H::plan(s, k, d);
}

std::string plan_name(const ShrinkPlan& p) {
  switch (p.path) {
    case ShrinkPath::none: return "none";
    case ShrinkPath::zero: return "memset";
    case ShrinkPath::cluster:
      return "cluster/bm" + num(16 * p.cluster.mg) + "/nbw" + num(p.cluster.nbw) + "/c" + num(p.cluster.cluster);
    case ShrinkPath::decode: return p.per_token ? "decode/token" : "decode/tile";
    case ShrinkPath::fused: {
      const H::FusedConfig& c = p.fused;
      std::string s = c.wg_n > 0 ? "wgmma/n" + num(c.wg_n)
                      : c.wk     ? std::string("fused_wk/bm64")
                                 : "fused/bm" + num(c.bm) + "/ngw" + num(c.ngw);
      if (c.stream_k) s += "/sk" + num(c.sk_blocks);
      else if (c.ksplit > 1) s += "/splitk" + num(c.ksplit);
      return s;
    }
    case ShrinkPath::mma: return "mma/bn" + num(p.mma.bn) + (p.mma.ksplit > 1 ? "/splitk" + num(p.mma.ksplit) : "");
    case ShrinkPath::gemv:
      return std::string(p.atomic ? "gemv/atomic" : "gemv/store") + (p.gemv.nsplit > 1 ? "/splitk" + num(p.gemv.nsplit) : "") +
             (p.atomic && !p.pdl ? "/memset" : "");
  }
  return "?";
}

std::string describe_lora_shrink_plan(const LoraShrinkArgs& a, ShrinkKernel k) { return plan_name(lora_shrink_plan(a, k)); }

void launch_lora_shrink(const LoraShrinkArgs& a, cudaStream_t stream) {
  launch_impl(a, ShrinkKernel::automatic, stream);
}

void launch_lora_shrink_with(const LoraShrinkArgs& a, ShrinkKernel k, cudaStream_t stream) {
  launch_impl(a, k, stream);
}

namespace detail {

int shrink_partials_nsplit(int64_t K) { return H::gemv_config(K, 1, false).nsplit; }

int launch_shrink_partials(const LoraShrinkArgs& a, float* partials, cudaStream_t stream) {
  validate(a);
  const H::GemvConfig c = H::gemv_config(a.hidden, a.max_rank, false);
  if (a.num_tokens == 0 || a.max_rank == 0 || a.max_loras == 0) return c.nsplit;
  ShrinkParams p = make_params(a);
  p.y = partials;
  launch_shrink_gemv_partials(p, a.dtype, shrink_vec_ok(a, p), c, stream);
  return c.nsplit;
}

}  // namespace detail
}  // namespace punica::kernels
