// The DESIGN §6 comparison (check.h) on hand-made tensors: the tolerance, NaN never right, the 1-ulp
// slack of accumulating outputs, kept elements bit-equal, the compared subset.
#include <gtest/gtest.h>
#include <cmath>
#include "kernels/common/check.h"
#include "kernels/common/host_tensor.h"

namespace punica::kernels {
namespace {

HostTensor vals(DType t, std::initializer_list<double> v) {
  HostTensor h(t, v.size());
  std::size_t i = 0;
  for (double x : v) h.set(i++, x);
  return h;
}
CheckSpec spec_of(const HostTensor& t, const HostTensor* y0 = nullptr) {
  CheckSpec s;
  s.dtype = t.dtype;
  s.n = t.n;
  s.y0 = y0 ? y0->data() : nullptr;
  s.name = "y";
  return s;
}

TEST(Check, ToleranceAndNaN) {
  const HostTensor want = vals(DType::f32, {1.0, -2.0, 3.0, 0.0});
  HostTensor got = want;
  got.set(0, 1.0 + 1e-6);
  CheckResult r = check_close(got.data(), want.data(), 1e-5, spec_of(want));
  EXPECT_EQ(r.nwrong, 0u);
  EXPECT_EQ(r.nelems, 4u);
  EXPECT_NEAR(r.atol, 1e-5 * std::sqrt(14.0 / 4), 1e-12);
  got.set(1, -2.1);
  got.set(3, std::nan(""));
  r = check_close(got.data(), want.data(), 1e-5, spec_of(want));
  EXPECT_EQ(r.nwrong, 2u);
  ASSERT_EQ(r.first_mismatches.size(), 2u);
  EXPECT_EQ(r.first_mismatches[0], "y[1] (row 0) got -2.1 want -2");
}

// NOTES v14: y0 = -0.98046875, the delta exactly the bf16 midpoint 1.05078125, rounded either way.
TEST(Check, OneUlpOfTheDeltaForAccumulatingOutputs) {
  const HostTensor y0 = vals(DType::bf16, {-0.98046875});
  const HostTensor want = vals(DType::bf16, {-0.98046875 + 1.0546875});
  const HostTensor got = vals(DType::bf16, {-0.98046875 + 1.046875});
  EXPECT_EQ(check_close(got.data(), want.data(), 1e-2, spec_of(want, &y0)).nwrong, 0u);
  EXPECT_EQ(check_close(got.data(), want.data(), 1e-2, spec_of(want)).nwrong, 1u);  // no y0: no slack
  HostTensor poison(DType::bf16, 1);
  poison.fill_nan();
  EXPECT_EQ(check_close(got.data(), want.data(), 1e-2, spec_of(want, &poison)).nwrong, 1u);  // NaN y0: none
  EXPECT_EQ(ulp_of(DType::bf16, 1.05078125), 0.0078125);
  EXPECT_EQ(ulp_of(DType::f16, 1.5), std::ldexp(1.0, -10));
  EXPECT_EQ(ulp_of(DType::f32, 0.0), 0.0);
}

TEST(Check, KeptElementsBitEqualAndComparedSubset) {
  const HostTensor y0 = vals(DType::f16, {1.0, 2.0, 3.0});
  HostTensor want = vals(DType::f16, {5.0, 2.0, 7.0});
  HostTensor got = want;
  CheckSpec s = spec_of(want, &y0);
  s.keep = [](std::size_t i) { return i == 1; };
  EXPECT_EQ(check_close(got.data(), want.data(), 5e-3, s).nwrong, 0u);
  got.set_bits(1, y0.bits(1) ^ 1u);  // one bit off the initial value
  const CheckResult r = check_close(got.data(), want.data(), 5e-3, s);
  EXPECT_EQ(r.nwrong, 1u);
  EXPECT_EQ(r.nuntouched, 1u);
  EXPECT_FALSE(r.untouched_ok);
  s.compared = [](std::size_t i) { return i != 1; };
  EXPECT_EQ(check_close(got.data(), want.data(), 5e-3, s).nwrong, 0u);
  EXPECT_EQ(nan_bits(DType::bf16), 0x7fc0u);
}

TEST(Check, Int32Exact) {
  const int32_t a[3] = {1, 2, 3}, b[3] = {1, 5, 3};
  CheckSpec s;
  s.n = 3;
  s.name = "ids";
  const CheckResult r = check_equal_i32(a, b, s);
  EXPECT_EQ(r.nwrong, 1u);
  EXPECT_EQ(r.first_mismatches.at(0), "ids[1] got 2 want 5");
}

}  // namespace
}  // namespace punica::kernels
