// CpuBackend: tensors in host memory, ops = the Eigen reference, collectives = MPI (through Dist),
// timing = steady clock. Lets `mpirun -np N punica-bench check --backend cpu` exercise the whole
// pipeline, the TP slicing and the collectives on a machine without a GPU.
#include <Eigen/Dense>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include "apps/punica-bench/backend/backend.h"
#include "apps/punica-bench/dist.h"
#include "kernels/common/error.h"

namespace punica::bench {
namespace {

using kernels::DType;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const Dist* dist) : dist_(dist) {}
  std::string name() const override { return "cpu"; }
  nlohmann::json device_info() const override {
    return {{"name", "cpu"}, {"threads", int(std::thread::hardware_concurrency())}};
  }
  std::size_t l2_bytes() const override { return 0; }
  // The host's available memory (MemAvailable), what the case-size check weighs cases against.
  std::size_t free_memory_bytes() const override {
    std::ifstream f("/proc/meminfo");
    std::string key;
    std::size_t kb = 0;
    while (f >> key >> kb) {
      if (key == "MemAvailable:") return kb * 1024;
      f.ignore(256, '\n');
    }
    return std::size_t(8) << 30;  // no /proc: assume 8 GiB
  }

  void* alloc(std::size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    PUNICA_REQUIRE(p, ErrorKind::runtime, "host allocation of " + std::to_string(bytes) + " bytes failed");
    return p;
  }
  void release(void* p) override { std::free(p); }
  void upload(void* d, const void* s, std::size_t n) override { if (n) std::memcpy(d, s, n); }
  void download(void* d, const void* s, std::size_t n) override { if (n) std::memcpy(d, s, n); }
  void copy(void* d, const void* s, std::size_t n) override { if (n) std::memmove(d, s, n); }
  void fill_pattern(void* p, std::size_t n, int eb, uint32_t pat) override {
    if (eb == 4) { auto* q = static_cast<uint32_t*>(p); for (std::size_t i = 0; i < n; ++i) q[i] = pat; }
    else { auto* q = static_cast<uint16_t*>(p); for (std::size_t i = 0; i < n; ++i) q[i] = uint16_t(pat); }
  }
  void zero(void* p, std::size_t n) override { if (n) std::memset(p, 0, n); }
  void synchronize() override {}

  void exec(const std::function<void(void*)>&, const std::function<void()>& cpu) override { cpu(); }
  void base_linear(const LinearArgs& a) override {
    using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Mat x(a.m, a.k), w(a.n, a.k);
    for (int64_t i = 0; i < a.m * a.k; ++i) x.data()[i] = kernels::load_elem(a.x, a.dtype, i);
    for (int64_t i = 0; i < a.n * a.k; ++i) w.data()[i] = kernels::load_elem(a.w, a.dtype, i);
    Mat y = x * w.transpose();
    for (int64_t r = 0; r < a.m; ++r)
      for (int64_t c = 0; c < a.n; ++c) {
        std::size_t idx = std::size_t(r * a.ldy + c);
        float v = y(r, c);
        if (a.bias) v += kernels::load_elem(a.bias, a.dtype, c);
        if (a.accumulate) v = kernels::load_elem(a.y, a.dtype, idx) + kernels::round_to(a.dtype, v);
        kernels::store_elem(a.y, a.dtype, idx, v);
      }
  }
  void add_bias(void* y, const void* bias, DType dt, int64_t rows, int64_t cols, int64_t ldy) override {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        std::size_t idx = std::size_t(r * ldy + c);
        kernels::store_elem(y, dt, idx, kernels::load_elem(y, dt, idx) + kernels::load_elem(bias, dt, std::size_t(c)));
      }
  }
  void embedding_lookup(void* y, const void* table, const int32_t* ids, DType dt, int64_t T, int64_t dim,
                        int64_t begin, int64_t end, int64_t ldy) override {
    const std::size_t es = kernels::dtype_size(dt);
    for (int64_t t = 0; t < T; ++t) {
      char* dst = static_cast<char*>(y) + std::size_t(t * ldy) * es;
      const int64_t id = ids[t];
      if (id >= begin && id < end)
        std::memcpy(dst, static_cast<const char*>(table) + std::size_t((id - begin) * dim) * es, std::size_t(dim) * es);
      else
        std::memset(dst, 0, std::size_t(dim) * es);
    }
  }

  void gather_rows(void* dst, const void* src, const int32_t* idx, const float* scale, DType dt, int64_t rows,
                   int64_t cols, int64_t ld_dst, int64_t ld_src) override {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t s = idx[i];
      for (int64_t c = 0; c < cols; ++c) {
        float v = s < 0 ? 0.f : kernels::load_elem(src, dt, std::size_t(s * ld_src + c));
        if (s >= 0 && scale) v *= scale[i];
        kernels::store_elem(dst, dt, std::size_t(i * ld_dst + c), v);
      }
    }
  }
  void moe_activation(void* out, const void* in, DType dt, int64_t rows, int64_t inter, kernels::MoeAct act) override {
    const int64_t ld = act == kernels::MoeAct::silu ? inter : 2 * inter;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < inter; ++c) {
        float g, u = 1.f;
        if (act == kernels::MoeAct::gated_halves) {
          g = kernels::load_elem(in, dt, std::size_t(i * ld + c));
          u = kernels::load_elem(in, dt, std::size_t(i * ld + inter + c));
        } else if (act == kernels::MoeAct::gated_interleaved) {
          g = kernels::load_elem(in, dt, std::size_t(i * ld + 2 * c));
          u = kernels::load_elem(in, dt, std::size_t(i * ld + 2 * c + 1));
        } else {
          g = kernels::load_elem(in, dt, std::size_t(i * ld + c));
        }
        kernels::store_elem(out, dt, std::size_t(i * inter + c), g / (1.f + std::exp(-g)) * u);
      }
  }
  void moe_sum(void* out, const void* in, DType dt, int64_t tokens, int top_k, int64_t cols) override {
    for (int64_t m = 0; m < tokens; ++m)
      for (int64_t c = 0; c < cols; ++c) {
        float acc = 0.f;
        for (int j = 0; j < top_k; ++j) acc += kernels::load_elem(in, dt, std::size_t((m * top_k + j) * cols + c));
        kernels::store_elem(out, dt, std::size_t(m * cols + c), acc);
      }
  }
  void grouped_linear(const std::vector<LinearArgs>& gemms, void*) override {
    for (const auto& g : gemms)
      if (g.m > 0 && g.n > 0) base_linear(g);
  }

  void all_gather_f32(const float* in, float* out, std::size_t count, int tp) override {
    if (tp == 1) { std::memcpy(out, in, count * 4); return; }
    need_dist(tp).group_all_gather_f32(in, out, count, tp);
  }
  void all_gather_last_dim_f32(const float* in, float* out, float* tmp, int64_t rows, int64_t cols,
                               int tp) override {
    all_gather_f32(in, tmp, std::size_t(rows * cols), tp);
    for (int r = 0; r < tp; ++r)
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(out + i * tp * cols + r * cols, tmp + (r * rows + i) * cols, std::size_t(cols) * 4);
  }
  void all_reduce_sum_f32(float* inout, std::size_t count, int tp) override {
    if (tp == 1) return;
    need_dist(tp).group_all_reduce_sum_f32(inout, count, tp);
  }
  void all_reduce_sum(void* inout, DType dt, std::size_t count, int tp) override {
    if (tp == 1) return;
    if (dt == DType::f32) { all_reduce_sum_f32(static_cast<float*>(inout), count, tp); return; }
    std::vector<float> tmp(count);
    for (std::size_t i = 0; i < count; ++i) tmp[i] = kernels::load_elem(inout, dt, i);
    need_dist(tp).group_all_reduce_sum_f32(tmp.data(), count, tp);
    for (std::size_t i = 0; i < count; ++i) kernels::store_elem(inout, dt, i, tmp[i]);
  }

  std::vector<double> time_iterations(int warmup, int iters, const std::function<void(int)>& body) override {
    for (int i = 0; i < warmup; ++i) body(i);
    std::vector<double> t(iters);
    for (int i = 0; i < iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      body(i);
      t[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    return t;
  }
  double time_batch(int calls, int replays, const std::function<void(int)>& body) override {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < replays; ++r)
      for (int i = 0; i < calls; ++i) body(i);
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return us / double(calls * replays);
  }
  std::string timing_method() const override { return "steady_clock"; }
  Ceilings measure_ceilings() override {
    Ceilings c;
    const std::size_t n = std::size_t(64) << 20;
    std::vector<char> a(n, 1), b(n, 0);
    std::memcpy(b.data(), a.data(), n);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c.copy_gb_per_s = 3.0 * 2.0 * double(n) / s / 1e9;
    return c;
  }
  double baseline_gemm_us(DType, int64_t, int64_t, int64_t, int, bool) override { return -1; }
  GroupedTimes baseline_grouped_gemm_us(DType, const std::vector<Group>&, int, bool) override { return {}; }

 private:
  const Dist& need_dist(int tp) const {
    PUNICA_REQUIRE(dist_, ErrorKind::runtime, "tp=" + std::to_string(tp) + " needs an MPI launch");
    return *dist_;
  }
  const Dist* dist_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Dist* dist) { return std::make_unique<CpuBackend>(dist); }

}  // namespace punica::bench
