// DESIGN §6 comparison (check.h).
#include "kernels/common/check.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace punica::kernels {
namespace {

std::string fmt(double v, int prec = 3) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*g", prec, v);
  return b;
}

}  // namespace

double ulp_of(DType t, double v) {
  if (!(v > 0) || !std::isfinite(v)) return 0;
  const int p = t == DType::bf16 ? 7 : t == DType::f16 ? 10 : 23;  // stored mantissa bits
  int ex = 0;
  std::frexp(v, &ex);  // v = m 2^ex, m in [0.5, 1)
  return std::ldexp(1.0, ex - 1 - p);
}

CheckResult check_equal_i32(const int32_t* actual, const int32_t* expected, const CheckSpec& spec) {
  CheckResult r;
  for (std::size_t i = 0; i < spec.n; ++i) {
    if (spec.compared && !spec.compared(i)) continue;
    ++r.nelems;
    if (actual[i] != expected[i]) {
      if (r.first_mismatches.size() < 5)
        r.first_mismatches.push_back(spec.name + "[" + std::to_string(i) + "] got " + std::to_string(actual[i]) +
                                     " want " + std::to_string(expected[i]));
      ++r.nwrong;
    }
  }
  return r;
}

CheckResult check_close(const void* actual, const void* expected, double rtol, const CheckSpec& spec) {
  CheckResult r;
  r.rtol = rtol;
  const std::size_t n = spec.n, es = dtype_size(spec.dtype);
  const DType dt = spec.dtype;
  auto row_of = [&](std::size_t i) {
    return spec.rows > 0 ? int64_t((i / std::size_t(spec.inner)) % std::size_t(spec.rows)) : int64_t(0);
  };
  auto note = [&](std::size_t i, const std::string& what) {
    if (r.first_mismatches.size() < 5) r.first_mismatches.push_back(spec.name + "[" + std::to_string(i) + "] " + what);
  };
  auto kept = [&](std::size_t i) { return spec.y0 && spec.keep && spec.keep(i); };
  double ss = 0;
  std::size_t cnt = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if ((spec.compared && !spec.compared(i)) || kept(i)) continue;
    const double e = load_elem(expected, dt, i);
    if (std::isfinite(e)) {
      ss += e * e;
      ++cnt;
    }
  }
  r.rms = cnt ? std::sqrt(ss / double(cnt)) : 0.0;
  r.atol = rtol * r.rms;
  for (std::size_t i = 0; i < n; ++i) {
    if (spec.compared && !spec.compared(i)) continue;
    ++r.nelems;
    if (kept(i)) {
      const char* ai = static_cast<const char*>(actual) + i * es;
      const char* ii = static_cast<const char*>(spec.y0) + i * es;
      if (std::memcmp(ai, ii, es) != 0) {
        ++r.nwrong;
        ++r.nuntouched;
        r.untouched_ok = false;
        note(i, "must stay untouched: got " + fmt(load_elem(actual, dt, i)) + " initial " +
                    fmt(load_elem(spec.y0, dt, i)));
      }
      continue;
    }
    const double a = load_elem(actual, dt, i), e = load_elem(expected, dt, i);
    const double d = std::fabs(a - e);
    double slack = 0;
    if (spec.y0) {
      const double y0 = load_elem(spec.y0, dt, i);
      if (std::isfinite(y0) && std::isfinite(e)) slack = ulp_of(dt, std::fabs(e - y0));
    }
    const bool ok = std::isfinite(a) && std::isfinite(e) && d <= r.atol + rtol * std::fabs(e) + slack;
    if (std::isfinite(d)) {
      r.max_abs_err = std::max(r.max_abs_err, d);
      if (std::fabs(e) > r.atol) r.max_rel_err = std::max(r.max_rel_err, d / std::fabs(e));
    }
    if (!ok) {
      ++r.nwrong;
      note(i, "(row " + std::to_string(row_of(i)) + ") got " + fmt(a, 6) + " want " + fmt(e, 6));
    }
  }
  return r;
}

}  // namespace punica::kernels
