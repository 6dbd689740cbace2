// launch_apply_lora_full_linear against punica::ref::apply_lora_full_linear: replaced rows
// (enabled module) within tolerance, rows of -1 / disabled modules and columns past out_features
// bit-equal to y0, bias and null bias, in_features 2049 (misaligned rows), guards, R = 0 / 1.
#include <gtest/gtest.h>

#include "kernels/apply_lora_full_linear/apply_lora_full_linear.h"
#include "kernels/common/test_util.h"

namespace punica::kernels::testing {
namespace {

struct FullCase {
  DType dtype;
  int64_t R, in, out;
  std::vector<int32_t> enabled;  // per slot
  std::vector<int32_t> slots;
  bool bias = true;
  int64_t x_pad = 0, y_pad = 0;
};

void run_case(const FullCase& c, uint64_t seed) {
  const int L = int(c.enabled.size());
  const int64_t R = c.R, In = c.in, Out = c.out, xs = In + c.x_pad, ys = Out + c.y_pad;
  const std::vector<int32_t> mapping = random_mapping(seed, R, c.slots);
  HostTensor x(c.dtype, std::size_t(std::max<int64_t>(R, 1) * xs));
  HostTensor W(c.dtype, std::size_t(L) * Out * In), b(c.dtype, std::size_t(L) * Out);
  x.fill_uniform(seed + 1);
  W.fill_uniform(seed + 2, 0.05f);
  b.fill_uniform(seed + 3);
  HostTensor y0(c.dtype, std::size_t(std::max<int64_t>(R, 1) * ys));
  y0.fill_uniform(seed + 4, 3.0f);

  const HostMeta hm = host_meta(mapping, L);
  HostTensor ref = y0;
  ApplyLoraFullLinearArgs a;
  a.dtype = c.dtype;
  a.num_rows = R;
  a.in_features = In;
  a.out_features = Out;
  a.x = x.data();
  a.x_row_stride = xs;
  a.weight = W.data();
  a.bias = c.bias ? b.data() : nullptr;
  a.module_enabled = c.enabled.data();
  a.max_loras = L;
  a.meta.token_lora_mapping = hm.mapping.data();
  a.y = ref.data();
  a.y_row_stride = ys;
  punica::ref::apply_lora_full_linear(a);

  GuardedBuffer dx = to_guarded(x), dW = to_guarded(W), db = to_guarded(b), dy = to_guarded(y0),
                den = to_guarded(c.enabled);
  DeviceMeta dm = upload_meta(hm);
  a.x = dx.data();
  a.weight = dW.data();
  a.bias = c.bias ? db.data() : nullptr;
  a.module_enabled = den.as<int32_t>();
  a.meta = dm.view();
  a.y = dy.data();
  launch_apply_lora_full_linear(a, nullptr);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  HostTensor y(c.dtype, y0.n);
  dy.download(y.data(), y.nbytes());
  EXPECT_TRUE(dy.guards_ok());

  const CompareResult r = compare(y, ref, y0, R, ys, [&](int64_t i, int64_t j) {
    const int32_t s = mapping[std::size_t(i)];
    return s >= 0 && c.enabled[std::size_t(s)] != 0 && j < Out;
  });
  EXPECT_EQ(r.nwrong, 0) << r.first << " (checked " << r.nchecked << ", rms " << r.rms << ")";
  EXPECT_EQ(r.nbitdiff, 0) << r.first;
  int64_t replaced = 0;
  for (int32_t s : mapping) replaced += (s >= 0 && c.enabled[std::size_t(s)] != 0) ? 1 : 0;
  EXPECT_EQ(r.nchecked, replaced * Out);
}

const DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};

TEST(ApplyLoraFullLinear, ClassifierHeads) {
  uint64_t seed = 10;
  for (DType t : kDtypes)
    for (int64_t R : {1, 8, 70}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " R=" + std::to_string(R));
      run_case({t, R, 4096, 3, {1, 0, 1, 1}, {-1, 0, 1, 3}}, ++seed);            // slot 1 disabled
      run_case({t, R, 4096, 37, {1, 1, 1}, {-1, 0, 2}, /*bias=*/false}, ++seed);  // null bias
      run_case({t, R, 2049, 5, {1, 1}, {-1, 0, 1}, true, 0, 2}, ++seed);          // misaligned
      run_case({t, R, 2048, 64, {0, 1}, {0, 1}, true, 1, 0}, ++seed);             // x stride odd
    }
}

TEST(ApplyLoraFullLinear, EdgeBatches) {
  uint64_t seed = 50;
  for (DType t : kDtypes) {
    SCOPED_TRACE(dtype_name(t));
    run_case({t, 0, 1024, 4, {1}, {0}}, ++seed);
    run_case({t, 16, 1024, 4, {1, 1}, {-1}}, ++seed);   // all -1: untouched
    run_case({t, 16, 1024, 4, {0, 0}, {0, 1}}, ++seed);  // all disabled: untouched
    run_case({t, 300, 1024, 1000, {1, 1, 0, 1}, {-1, 0, 1, 2, 3}}, ++seed);
  }
}

}  // namespace
}  // namespace punica::kernels::testing

namespace punica::kernels::testing {
namespace {

TEST(ApplyLoraFullLinear, DISABLED_Timing) {
  const int L = 4;
  const int64_t In = 4096;
  for (int64_t Out : {3, 1024})
    for (int64_t R : {1, 64, 512}) {
      const std::vector<int32_t> m = random_mapping(5, R, {0, 1, 2, 3});
      std::vector<int32_t> en(L, 1);
      DeviceBuffer x(R * In * 2), W(std::size_t(L) * Out * In * 2), b(L * Out * 2), y(R * Out * 2), de(L * 4);
      for (DeviceBuffer* p : {&x, &W, &b, &y}) device_fill_pattern(p->get(), p->bytes() / 2, 2, 0x3c00, nullptr);
      de.upload(en.data(), L * 4);
      DeviceMeta dm = gpu_meta(m, L);
      ApplyLoraFullLinearArgs a;
      a.dtype = DType::bf16;
      a.num_rows = R;
      a.in_features = In;
      a.out_features = Out;
      a.x = x.get();
      a.x_row_stride = In;
      a.weight = W.get();
      a.bias = b.get();
      a.module_enabled = de.as<int32_t>();
      a.max_loras = L;
      a.meta = dm.view();
      a.y = y.get();
      a.y_row_stride = Out;
      const double us = time_us([&] { launch_apply_lora_full_linear(a, nullptr); });
      const int active = int(std::min<int64_t>(R, L));
      const double bytes = double(active) * Out * In * 2 + double(R) * In * 2 + double(R) * Out * 2;
      std::printf("TIMING apply_lora_full_linear bf16 R=%lld in=%lld out=%lld: %.2f us, %.0f GB/s\n",
                  (long long)R, (long long)In, (long long)Out, us, bytes / us / 1e3);
    }
}

}  // namespace
}  // namespace punica::kernels::testing
