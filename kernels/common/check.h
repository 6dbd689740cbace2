// The DESIGN §6 comparison of an op's output with its reference, the one implementation that the
// bench's runner, the GPU tests and the reference tests share. Plain C++ (no CUDA, no Eigen).
//   |y - r| <= atol + rtol |r| + slack,  atol = rtol * rms(r over the compared, finite r),
// slack = one unit in the last place of |r - y0| in the output dtype where the output accumulates
// onto a finite initial y0 (the op adds a delta it rounded from an fp32 dot whose summation order is
// unspecified: at a rounding tie either neighbour is right, and once the add cancels against y0
// that unit can exceed the tolerance; results/NOTES.md v14). NaN or inf in y or r is never right.
// Elements marked `keep` must stay bit-equal to y0 (rows of -1 tokens, columns outside the slices).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "kernels/common/dtype.h"

namespace punica::kernels {

// DESIGN §6 rtol of an output dtype: 1e-5 fp32, 5e-3 fp16, 1e-2 bf16.
inline double rtol_for(DType t) { return t == DType::bf16 ? 1e-2 : t == DType::f16 ? 5e-3 : 1e-5; }
// One unit in the last place of |v| in dtype t (0 for 0 or non-finite v).
double ulp_of(DType t, double v);

struct CheckResult {
  std::size_t nelems = 0;      // compared elements (kept ones included)
  std::size_t nwrong = 0;      // out of tolerance, non-finite, or a kept element changed
  std::size_t nuntouched = 0;  // of nwrong: kept elements that changed
  double max_abs_err = 0, max_rel_err = 0, atol = 0, rtol = 0, rms = 0;
  bool untouched_ok = true;
  std::vector<std::string> first_mismatches;  // up to 5, "name[i] (row r) got .. want .."
};

// What one comparison covers. Elements i in [0, n) of dtype `dtype`.
struct CheckSpec {
  DType dtype = DType::f32;
  std::size_t n = 0;
  // The output's initial contents (accumulating outputs: y0; write-only outputs: their NaN poison);
  // nullptr = none. Gives the 1-ulp slack (finite y0) and the value kept elements must hold.
  const void* y0 = nullptr;
  // Not compared at all where false (e.g. rows the check does not sample); empty = every element.
  std::function<bool(std::size_t)> compared;
  // Must stay bit-equal to y0 where true; empty = none (needs y0).
  std::function<bool(std::size_t)> keep;
  // Messages: the tensor's name, and the row of element i as (i / inner) % rows (rows = 0: none).
  std::string name;
  int64_t rows = 0, inner = 1;
};

// Compares `actual` with `expected` (both spec.dtype, spec.n elements).
CheckResult check_close(const void* actual, const void* expected, double rtol, const CheckSpec& spec);
// int32 tensors: every compared element exactly equal.
CheckResult check_equal_i32(const int32_t* actual, const int32_t* expected, const CheckSpec& spec);

}  // namespace punica::kernels
