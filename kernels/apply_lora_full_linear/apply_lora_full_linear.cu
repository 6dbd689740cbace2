// ClassificationHeadWithLoRA's modules_to_save path: rows whose sampler slot s >= 0 has an enabled
// full module are REPLACED by round(W[s] @ x[j] + b[s]) (fp32 accumulation, bias added in fp32);
// other rows keep the base output. One row_dot launch (add_lora_logits/row_dot.cuh).
#include "kernels/apply_lora_full_linear/apply_lora_full_linear.h"
#include "kernels/add_lora_logits/row_dot.cuh"
#include "kernels/common/error.h"

namespace punica::kernels {
namespace {

template <class T>
struct FullLinearEpi {
  T* y;
  int64_t y_stride;
  const T* bias;  // [L, out] or null
  const int32_t* enabled;
  int out;
  __device__ __forceinline__ int outputs(int slot) const { return enabled[slot] ? out : 0; }
  __device__ __forceinline__ void store(int64_t row, int slot, int o, float acc) const {
    if (bias) acc += elem::load_ro(bias + int64_t(slot) * out + o);
    y[row * y_stride + o] = elem::from_f<T>(acc);
  }
};

}  // namespace

void launch_apply_lora_full_linear(const ApplyLoraFullLinearArgs& a, cudaStream_t stream) {
  PUNICA_REQUIRE(a.num_rows >= 0 && a.in_features >= 0 && a.out_features >= 0 && a.max_loras >= 0,
                 ErrorKind::usage, "apply_lora_full_linear: negative size");
  if (a.num_rows == 0 || a.out_features == 0 || a.max_loras == 0) return;
  PUNICA_REQUIRE(a.out_features < (int64_t(1) << 31), ErrorKind::usage,
                 "apply_lora_full_linear: out_features too large");
  PUNICA_REQUIRE(a.y && a.module_enabled && a.meta.token_lora_mapping &&
                     (a.in_features == 0 || (a.x && a.weight)),
                 ErrorKind::usage, "apply_lora_full_linear: null pointer");
  PUNICA_REQUIRE(a.x_row_stride >= a.in_features && a.y_row_stride >= a.out_features,
                 ErrorKind::usage, "apply_lora_full_linear: row stride smaller than the row");
  elem::dispatch_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const FullLinearEpi<T> epi{static_cast<T*>(a.y), a.y_row_stride, static_cast<const T*>(a.bias),
                               a.module_enabled, int(a.out_features)};
    row_dot::launch<T>(a.num_rows, int(a.out_features), a.in_features, static_cast<const T*>(a.x),
                       a.x_row_stride, static_cast<const T*>(a.weight),
                       a.out_features * a.in_features, a.meta.token_lora_mapping, epi, stream);
  });
}

std::string describe_apply_lora_full_linear_plan(const ApplyLoraFullLinearArgs& a) {
  if (a.num_rows <= 0 || a.out_features <= 0 || a.max_loras <= 0) return "none";
  return "row_dot/opb" + std::to_string(pick_row_dot_opb(a.num_rows, int(a.out_features), current_sm_count()));
}

}  // namespace punica::kernels
