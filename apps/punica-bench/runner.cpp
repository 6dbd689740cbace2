// The case loop: check, then cold and back-to-back timing, floors and baselines (see runner.h).
#include "apps/punica-bench/runner.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <thread>
#include "apps/punica-bench/dist.h"
#include "apps/punica-bench/npy.h"
#include "apps/punica-bench/report.h"
#include "kernels/common/check.h"
#include "kernels/common/error.h"
#include "kernels/common/hash_rng.h"

namespace punica::bench {
namespace {

constexpr std::size_t kGuardBytes = 256;
constexpr uint32_t kGuardPattern = 0xA5C3A5C3u;

// One set of the problem's tensors in the backend's memory; outputs carry guard regions.
struct DeviceSet {
  std::vector<Buffer> bufs;
  std::vector<void*> ptrs;
};
DeviceSet upload_set(Backend& be, const Problem& p, bool guards) {
  DeviceSet d;
  for (auto& t : p.tensors) {
    bool g = guards && t.role == Role::output;
    std::size_t gb = g ? kGuardBytes : 0;
    d.bufs.emplace_back(be, t.bytes() + 2 * gb);
    char* base = static_cast<char*>(d.bufs.back().get());
    if (g) {  // host-written guards: the tail one may start at any byte offset
      static const std::vector<uint32_t> pattern(kGuardBytes / 4, kGuardPattern);
      be.upload(base, pattern.data(), kGuardBytes);
      be.upload(base + gb + t.bytes(), pattern.data(), kGuardBytes);
    }
    if (t.role == Role::scratch) be.zero(base + gb, t.bytes());
    else be.upload(base + gb, t.data.data(), t.bytes());
    d.ptrs.push_back(base + gb);
  }
  return d;
}

std::string fmt(double v, int prec = 3) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*g", prec, v);
  return b;
}

std::string npy_descr(const HostTensor& t) { return t.is_int ? "<i4" : "<f4"; }
std::vector<float> as_f32(const HostTensor& t, const void* data) {
  std::vector<float> v(t.numel());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = kernels::load_elem(data, t.dtype, i);
  return v;
}
void dump_tensor(const std::string& dir, const std::string& name, const HostTensor& t, const void* data,
                 nlohmann::json& manifest) {
  std::string file = name + ".npy";
  if (t.is_int || t.dtype == kernels::DType::f32) write_npy(dir + "/" + file, npy_descr(t), t.shape, data, t.bytes());
  else {
    auto f = as_f32(t, data);
    write_npy(dir + "/" + file, "<f4", t.shape, f.data(), f.size() * 4);
  }
  manifest["tensors"].push_back({{"name", name}, {"file", file}, {"shape", t.shape},
                                 {"dtype", t.is_int ? "int32" : kernels::dtype_name(t.dtype)},
                                 {"stored_as", t.is_int ? "int32" : "float32"}});
}
std::string safe_name(const std::string& id) {
  std::string s = id;
  for (char& c : s) if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '=') c = '_';
  return s;
}

}  // namespace

double ulp_of(kernels::DType t, double v) { return kernels::ulp_of(t, v); }

CompareResult compare_tensor(const HostTensor& t, const void* actual, const void* expected, double rtol,
                             const std::function<bool(int64_t)>& row_filter) {
  // The DESIGN §6 comparison of kernels/common/check.h (the 1-ulp slack of accumulating outputs
  // included); int tensors exactly equal.
  kernels::CheckSpec spec;
  spec.dtype = t.dtype;
  spec.n = t.numel();
  spec.name = t.name;
  spec.rows = t.rows;
  spec.inner = t.inner;
  kernels::CheckResult c;
  if (t.is_int) {
    c = kernels::check_equal_i32(static_cast<const int32_t*>(actual), static_cast<const int32_t*>(expected), spec);
  } else {
    spec.y0 = t.data.empty() ? nullptr : t.data.data();
    spec.compared = [&](std::size_t i) {
      return row_filter(t.rows > 0 ? int64_t((i / std::size_t(t.inner)) % std::size_t(t.rows)) : 0);
    };
    if (!t.must_keep.empty()) spec.keep = [&](std::size_t i) { return t.must_keep[i] != 0; };
    c = kernels::check_close(actual, expected, rtol, spec);
  }
  CompareResult r;
  r.nelems = c.nelems;
  r.nwrong = c.nwrong;
  r.max_abs_err = c.max_abs_err;
  r.max_rel_err = c.max_rel_err;
  r.atol = c.atol;
  r.rtol = rtol;
  r.untouched_ok = c.untouched_ok;
  r.first_mismatches = std::move(c.first_mismatches);
  return r;
}

Runner::Runner(Backend& be, Dist* dist, RunOptions opt) : be_(be), dist_(dist), opt_(std::move(opt)) {}

Ceilings Runner::measure_ceilings() {
  ceil_ = be_.measure_ceilings();
  if (dist_ && dist_->size() > 1) {  // the slowest rank's ceiling is the one that binds
    ceil_.copy_gb_per_s = -dist_->allreduce_max(-ceil_.copy_gb_per_s);
    ceil_.gemm_bf16_tflops = -dist_->allreduce_max(-ceil_.gemm_bf16_tflops);
    ceil_.graph_node_us = dist_->allreduce_max(ceil_.graph_node_us);
  }
  return ceil_;
}

CaseResult Runner::run_case(const Case& c, int index, int total) {
  const bool root = !dist_ || dist_->rank() == 0;
  const int world = dist_ ? dist_->size() : 1;
  CaseResult out;
  std::string err;
  if (root && opt_.verbose >= 0) {
    std::fprintf(stderr, "[%3d/%d] RUN  %s\n", index + 1, total, c.id.c_str());
    std::fflush(stderr);
  }
  if (dist_ && opt_.timeout_s > 0) { dist_->start_watchdog(); dist_->arm(opt_.timeout_s, "case '" + c.id + "'"); }
  auto t0 = std::chrono::steady_clock::now();
  try {
    // Test-only fault injection: "RANK:throw" or "RANK:hang" (issue 4, faults).
    if (!opt_.inject_fault.empty()) {
      auto colon = opt_.inject_fault.find(':');
      int fr = std::stoi(opt_.inject_fault.substr(0, colon));
      std::string kind = opt_.inject_fault.substr(colon + 1);
      int me = dist_ ? dist_->rank() : 0;
      if (fr == me && kind == "throw") fail(ErrorKind::runtime, "injected fault (--inject-fault " + opt_.inject_fault + ")");
      if (fr == me && kind == "hang") for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    out = run_case_impl(c);
  } catch (const std::exception& e) {
    err = e.what();
    if (world > 1) {
      // Other ranks may be inside a collective of this case: never leave them hanging.
      dist_->abort(6, "error in case " + c.id + ": " + err);
    }
    out = CaseResult{};
    out.c = &c;
    out.status = "error";
    out.error = err;
  }
  // Rank agreement: every case ends with an all-reduce of the status word and the wrong counts
  // (still under the case's --timeout: a rank that stopped leaves the others waiting here).
  if (dist_ && world > 1) {
    auto code = [](const std::string& s) { return s == "error" ? 3 : s == "fail" ? 2 : s == "pass" ? 1 : 0; };
    int worst = dist_->allreduce_max(code(out.status));
    int64_t nwrong = out.check ? int64_t(out.check->nwrong) : 0;
    int64_t total_wrong = dist_->allreduce_sum(nwrong);
    static const char* names[] = {"skip", "pass", "fail", "error"};
    out.status = names[worst];
    if (out.check) out.check->nwrong = std::size_t(total_wrong);
  }
  if (dist_ && opt_.timeout_s > 0) dist_->disarm();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (root && opt_.verbose >= 0) {
    std::string line;
    if (out.status == "skip") line = "SKIP " + out.skip_reason;
    else if (out.status == "error") line = "ERROR " + (out.error.empty() ? err : out.error);
    else {
      line = out.status == "pass" ? "PASS" : "FAIL";
      if (out.check) {
        line += " nwrong=" + std::to_string(out.check->nwrong) + "/" + std::to_string(out.check->nelems) +
                " max_rel=" + fmt(out.check->max_rel_err, 2);
        if (out.status == "fail")
          for (auto& m : out.check->first_mismatches) line += "\n         " + m;
      }
      if (out.timing) {
        const nlohmann::json rec = case_record(out);  // the floor fraction as the result states it
        line += "  " + fmt(out.timing->time.median, 4) + " us";
        const auto& ff = json_at(rec, {"metrics", "floor_fraction"});
        if (ff.is_number()) line += "  floor " + fmt(ff.get<double>() * 100, 3) + "%";
      }
    }
    std::fprintf(stderr, "[%3d/%d] %s  (%.2fs)\n", index + 1, total, line.c_str(), wall);
    if (opt_.print_repro) std::fprintf(stderr, "         repro: %s -f '^%s$'\n", opt_.repro_prefix.c_str(), c.id.c_str());
    std::fflush(stderr);
  }
  if (opt_.print_repro) out.repro = opt_.repro_prefix + " -f '^" + c.id + "$'";
  return out;
}

CaseResult Runner::run_case_impl(const Case& c) {
  CaseResult out;
  out.c = &c;
  if (!c.skip_reason.empty()) {
    out.status = "skip";
    out.skip_reason = c.skip_reason;
    return out;
  }
  if (!is_registered_op(c.op)) {
    out.status = "skip";
    out.skip_reason = "op '" + c.op + "' is not implemented in this build";
    return out;
  }
  const int world = dist_ ? dist_->size() : 1;
  if (c.tp > world) {
    out.status = "skip";
    out.skip_reason = "tp=" + std::to_string(c.tp) + " needs " + std::to_string(c.tp) + " ranks (" +
                         (be_.name() == "cuda" ? "GPUs" : "processes") + "), " + std::to_string(world) + " launched";
    return out;
  }
  if (world % c.tp != 0) {
    out.status = "skip";
    out.skip_reason = "tp=" + std::to_string(c.tp) + " does not divide the " + std::to_string(world) + " launched ranks";
    return out;
  }
  ProblemOptions po;
  po.nan_padding = opt_.nan_padding;
  po.exact = opt_.exact;
  {  // --inject-fault RANK:moe_*: a sharding bug the MoE layer plants on that rank (caught by the check)
    const auto colon = opt_.inject_fault.find(':');
    const int me = dist_ ? dist_->rank() : 0;
    if (colon != std::string::npos && opt_.inject_fault.compare(colon + 1, 4, "moe_") == 0 &&
        std::stoi(opt_.inject_fault.substr(0, colon)) == me)
      po.fault = opt_.inject_fault.substr(colon + 1);
    static const char* kMoeFaults[] = {"moe_expert_map", "moe_w2_weight_twice", "moe_w2_lora_unweighted",
                                       "moe_gather_order", "moe_w2_offset", "moe_b_slice"};
    PUNICA_REQUIRE(po.fault.empty() || std::any_of(std::begin(kMoeFaults), std::end(kMoeFaults),
                                                   [&](const char* f) { return po.fault == f; }),
                   ErrorKind::usage, "--inject-fault: unknown MoE fault '" + po.fault + "'");
  }
  auto prob = make_problem(c, po);
  auto& P = *prob;
  if (opt_.verbose >= 1 && (!dist_ || dist_->rank() == 0)) {
    std::string d = P.describe();
    if (!d.empty()) std::fprintf(stderr, "         %s\n", d.c_str());
    for (const auto& t : P.tensors) {
      if (t.role == Role::scratch) continue;
      std::string shape;
      for (auto x : t.shape) shape += (shape.empty() ? "" : "x") + std::to_string(x);
      std::fprintf(stderr, "         %-7s %-26s %-5s [%s]\n", t.role == Role::output ? "output" : "input",
                   t.name.c_str(), t.is_int ? "int32" : kernels::dtype_name(t.dtype), shape.c_str());
    }
  }

  // ---------------- check ----------------
  DeviceSet dev = upload_set(be_, P, /*guards=*/true);
  P.prepare(be_, dev.ptrs);
  // The decode kernels read the metadata before their griddepcontrol.wait, so it must not come from
  // the kernel directly before the op (kernels/lora_shrink/shrink_decode.h): finish it first, as the
  // timing below does.
  be_.synchronize();
  P.run(be_, dev.ptrs);
  be_.synchronize();
  // Host copies: actual (downloaded) and expected (reference from the same inputs).
  std::vector<std::vector<uint8_t>> actual(P.tensors.size()), expected(P.tensors.size());
  bool guard_ok = true;
  std::vector<void*> host_ptrs(P.tensors.size());
  for (std::size_t i = 0; i < P.tensors.size(); ++i) {
    const auto& t = P.tensors[i];
    if (t.role == Role::output) {
      std::vector<uint8_t> full(t.bytes() + 2 * kGuardBytes);
      be_.download(full.data(), static_cast<char*>(dev.ptrs[i]) - kGuardBytes, full.size());
      for (std::size_t g = 0; g < kGuardBytes / 4; ++g) {
        uint32_t a, b;
        std::memcpy(&a, full.data() + 4 * g, 4);
        std::memcpy(&b, full.data() + kGuardBytes + t.bytes() + 4 * g, 4);
        if (a != kGuardPattern || b != kGuardPattern) guard_ok = false;
      }
      actual[i].assign(full.begin() + kGuardBytes, full.begin() + kGuardBytes + std::ptrdiff_t(t.bytes()));
    }
    expected[i] = t.role == Role::scratch ? std::vector<uint8_t>(t.bytes(), 0) : t.data;
    host_ptrs[i] = expected[i].data();
  }
  // --sample-rows: the reference computes only a deterministic subset of rows.
  std::vector<uint8_t> sampled;
  if (opt_.sample_rows > 0 && P.mapping_tensor >= 0) {
    auto& mt = P.tensors[std::size_t(P.mapping_tensor)];
    int64_t rows = int64_t(mt.numel());
    if (rows > opt_.sample_rows) {
      sampled.assign(std::size_t(rows), 0);
      uint64_t key = hash_key(c.seed, hash_string(c.id), hash_string("sample_rows"));
      std::vector<int64_t> idx(static_cast<std::size_t>(rows));
      std::iota(idx.begin(), idx.end(), 0);
      for (int64_t i = 0; i < opt_.sample_rows; ++i) {  // partial Fisher-Yates
        int64_t j = i + int64_t(hash_below(key, uint64_t(i), uint64_t(rows - i)));
        std::swap(idx[std::size_t(i)], idx[std::size_t(j)]);
        sampled[std::size_t(idx[std::size_t(i)])] = 1;
      }
      auto* m = reinterpret_cast<int32_t*>(expected[std::size_t(P.mapping_tensor)].data());
      for (int64_t r = 0; r < rows; ++r) if (!sampled[std::size_t(r)]) m[r] = -1;
      P.row_sample = sampled;
    }
  }
  const bool naive = be_.name() == "cpu";
  P.reference(host_ptrs, naive);
  auto row_filter = [&](int64_t row) { return sampled.empty() || (row < int64_t(sampled.size()) && sampled[std::size_t(row)]); };
  CheckSummary chk;
  chk.mode = opt_.exact ? "exact" : "tolerance";
  chk.reference = naive ? "naive_fp64" : "eigen";
  chk.rtol = P.rtol();
  std::size_t nelems = 0, nwrong = 0;
  double max_abs = 0, max_rel = 0, atol = 0;
  bool untouched_ok = true;
  std::vector<std::string> mism;
  std::vector<const void*> got_ptrs(P.tensors.size()), want_ptrs(P.tensors.size());
  for (std::size_t i = 0; i < P.tensors.size(); ++i) {
    want_ptrs[i] = expected[i].data();
    got_ptrs[i] = P.tensors[i].role == Role::output ? actual[i].data() : expected[i].data();
  }
  const auto custom = P.custom_check(got_ptrs, want_ptrs);
  if (custom) {
    nelems = custom->nelems;
    nwrong = custom->nwrong;
    mism = custom->failures;
  }
  for (std::size_t i = 0; i < P.tensors.size() && !custom; ++i) {
    const auto& t = P.tensors[i];
    if (t.role != Role::output) continue;
    auto r = compare_tensor(t, actual[i].data(), expected[i].data(), opt_.exact ? 0.0 : P.rtol(), row_filter);
    nelems += r.nelems; nwrong += r.nwrong;
    max_abs = std::max(max_abs, r.max_abs_err); max_rel = std::max(max_rel, r.max_rel_err);
    atol = std::max(atol, r.atol);
    untouched_ok = untouched_ok && r.untouched_ok;
    for (auto& m : r.first_mismatches) mism.push_back(m);
  }
  if (!guard_ok) ++nwrong;
  chk.nelems = nelems; chk.nwrong = nwrong; chk.max_abs_err = max_abs; chk.max_rel_err = max_rel;
  chk.atol = atol; chk.guard_ok = guard_ok; chk.untouched_ok = untouched_ok;
  chk.sampled_rows = sampled.empty() ? 0 : opt_.sample_rows;
  chk.first_mismatches = mism;
  if (!guard_ok) chk.first_mismatches.push_back("guard region before/after an output was overwritten");
  out.check = chk;
  out.status = nwrong == 0 ? "pass" : "fail";
  if (be_.name() == "cuda") out.plan = P.plan(be_.kernel_choice());

  if (!opt_.dump_dir.empty() && (opt_.dump_all || out.status != "pass") && (!dist_ || dist_->rank() == 0)) {
    std::string dir = opt_.dump_dir + "/" + safe_name(c.id);
    std::filesystem::create_directories(dir);
    const nlohmann::json rec = case_record(out);
    nlohmann::json man = {{"id", c.id}, {"op", c.op}, {"params", rec["params"]}, {"status", out.status},
                          {"check", rec["check"]}, {"tensors", nlohmann::json::array()}};
    for (std::size_t i = 0; i < P.tensors.size(); ++i) {
      const auto& t = P.tensors[i];
      if (t.role == Role::scratch) continue;
      dump_tensor(dir, t.role == Role::output ? t.name + ".initial" : t.name, t, t.data.data(), man);
      if (t.role == Role::output) {
        dump_tensor(dir, t.name + ".expected", t, expected[i].data(), man);
        dump_tensor(dir, t.name + ".actual", t, actual[i].data(), man);
      }
    }
    std::ofstream(dir + "/manifest.json") << man.dump(2) << "\n";
  }

  Work w = P.work();
  double floor_us = ceil_.copy_gb_per_s > 0 ? w.bytes / (ceil_.copy_gb_per_s * 1e3) : 0.0;
  out.work = CaseResult::Work{w.bytes, w.flops, w.tokens};
  out.floor_us = floor_us;
  if (!opt_.timing || out.status != "pass") return out;

  // ---------------- timing ----------------
  std::size_t set_bytes = 0;
  for (auto& t : P.tensors) set_bytes += t.bytes();
  std::size_t copies = 1;
  if (be_.l2_bytes() > 0 && set_bytes > 0) {
    std::size_t want = (2 * be_.l2_bytes() + set_bytes - 1) / set_bytes;
    std::size_t cap = std::max<std::size_t>(1, std::min(be_.free_memory_bytes() / 4, std::size_t(8) << 30) / set_bytes);
    copies = std::clamp<std::size_t>(want, 1, std::min<std::size_t>(cap, 64));
  }
  std::vector<DeviceSet> sets;
  sets.push_back(std::move(dev));
  for (std::size_t i = 1; i < copies; ++i) {
    sets.push_back(upload_set(be_, P, false));
    P.prepare(be_, sets.back().ptrs);
  }
  be_.synchronize();
  int iters = opt_.iters > 0 ? opt_.iters : c.iters;
  int warmup = opt_.warmup >= 0 ? opt_.warmup : c.warmup;
  auto times = be_.time_iterations(warmup, iters, [&](int i) { P.run(be_, sets[std::size_t(i) % copies].ptrs); });
  bool held = be_.last_timing_held();  // ANDed with every later timed loop's, then over the ranks
  // true on every rank only when it is true on each (a collective: every rank calls it alike)
  auto on_all_ranks = [&](bool v) { return dist_ && dist_->size() > 1 ? dist_->allreduce_max(v ? 0.0 : 1.0) == 0.0 : v; };
  if (dist_ && dist_->size() > 1) dist_->allreduce_max_inplace(times);  // slowest rank per iteration
  TimingResult tr;
  tr.time = stats(times);
  tr.method = be_.timing_method();
  tr.rotated_copies = copies;
  tr.warmup = warmup;
  tr.iters = iters;
  tr.batch_calls = std::max<int>(opt_.batch_calls, int(copies));
  const int calls = tr.batch_calls;
  tr.batch_us = be_.time_batch(calls, 5, [&](int i) { P.run(be_, sets[std::size_t(i) % copies].ptrs); });
  if (be_.last_batch_nodes() >= 0 && calls > 0) tr.batch_nodes = double(be_.last_batch_nodes()) / calls;
  if (dist_ && dist_->size() > 1) tr.batch_us = dist_->allreduce_max(tr.batch_us);
  tr.batch_mode = be_.name() == "cuda" ? "cuda_graph" : "loop";
  if (opt_.baselines && be_.name() == "cuda") {
    Baseline bl = P.baseline();
    BaselineResult br;
    double dense = 0;
    bool ok = !bl.dense.empty(), bheld = true;  // bheld: every timed baseline loop ran behind a hold
    const kernels::DType bdt = P.dtype == kernels::DType::f32 ? kernels::DType::bf16 : P.dtype;
    for (auto& g : bl.dense) {
      double t = be_.baseline_gemm_us(bdt, g.m, g.n, g.k, 20, g.accumulate);
      if (t < 0) ok = false; else { dense += t; bheld = bheld && be_.last_timing_held(); }
    }
    // each Grouped entry (e.g. the shrink's GEMMs, then the expand's) timed both ways; a way's time
    // is the sum over the entries, and the baseline the faster way (issue 44)
    double batched = bl.grouped.empty() ? -1 : 0, graphed = batched;
    for (auto& g : bl.grouped) {
      const Backend::GroupedTimes t = be_.baseline_grouped_gemm_us(bdt, g.groups, 20, g.accumulate);
      batched = batched < 0 || t.batched_us < 0 ? -1 : batched + t.batched_us;
      graphed = graphed < 0 || t.graph_us < 0 ? -1 : graphed + t.graph_us;
      if (t.batched_us >= 0 || t.graph_us >= 0) bheld = bheld && be_.last_timing_held();
    }
    if (dist_ && dist_->size() > 1) {
      dense = dist_->allreduce_max(dense);
      batched = dist_->allreduce_max(batched);
      graphed = dist_->allreduce_max(graphed);
    }
    const double grouped = batched < 0 ? graphed : graphed < 0 ? batched : std::min(batched, graphed);
    br.cublas_grouped_batched_us = batched;
    br.cublas_gemm_graph_us = graphed;
    // a copy of the case's floor bytes, timed as the case is (Backend::baseline_copy_us): how near
    // the kernel is to what moving its bytes costs at this size, cold and back to back
    Backend::CopyBaseline cp = be_.baseline_copy_us(std::size_t(std::max(0.0, w.bytes)), iters, calls);
    if (cp.cold_us >= 0) bheld = bheld && be_.last_timing_held();
    if (dist_ && dist_->size() > 1) { cp.cold_us = dist_->allreduce_max(cp.cold_us); cp.batch_us = dist_->allreduce_max(cp.batch_us); }
    br.launches_held = on_all_ranks(bheld);
    br.cublas_us = ok ? dense : -1;
    br.cublas_grouped_us = grouped;
    br.copy_us = cp.cold_us;
    br.copy_batch_us = cp.batch_us;
    out.baseline = br;
  }
  // Layer cases: time the parts (base GEMM alone, LoRA part, each collective) the same way.
  auto parts = P.parts();
  for (auto& part : parts) {
    auto pt = be_.time_iterations(warmup, iters, [&](int i) { part.body(be_, sets[std::size_t(i) % copies].ptrs); });
    held = held && be_.last_timing_held();
    if (dist_ && dist_->size() > 1) dist_->allreduce_max_inplace(pt);
    tr.part_us.push_back({part.name, stats(pt).median});
    if (part.name == "base_gemms" && w.base_gemm_flops > 0 && stats(pt).median > 0) {
      out.base_gemm_tflops = w.base_gemm_flops / (stats(pt).median * 1e6);
      if (ceil_.gemm_bf16_tflops > 0) out.base_gemm_rate_fraction = out.base_gemm_tflops / ceil_.gemm_bf16_tflops;
    }
    // Collectives are also timed back to back inside one CUDA graph (vLLM captures its decode
    // forward in graphs; issue 4's decode all_gather target is graph-captured), and so is the LoRA
    // part (its copy baseline's back-to-back fraction compares with it).
    if (part.name.rfind("comm_", 0) == 0 || part.name == "lora") {
      double b = -1;
      try {
        b = be_.time_batch(calls, 5, [&](int i) { part.body(be_, sets[std::size_t(i) % copies].ptrs); });
      } catch (const Error& e) {
        b = -1;  // capture unsupported here: report null, keep going (every rank takes this path)
      }
      if (dist_ && dist_->size() > 1) b = dist_->allreduce_max(b);
      tr.part_batch_us[part.name] = b;
    }
  }
  // CUDA: every timed loop of the case (the op or layer, each part) waited behind a hold on every
  // rank, so no host launch gap is inside an event pair (kernels/common/stream_hold.h); false on the
  // CPU backend and after a hold that gave up
  tr.launches_held = on_all_ranks(held);
  for (auto& cm : P.comms()) {
    CommResult r;
    r.op = cm.op;
    r.bytes = cm.bytes;
    r.tp = cm.tp;
    for (auto& [name, us] : tr.part_us)
      if (name == cm.part) r.time_us = us;
    if (tr.part_batch_us.count(cm.part)) r.graph_time_us = tr.part_batch_us[cm.part];
    out.comm.push_back(r);
  }
  out.timing = tr;
  return out;
}

}  // namespace punica::bench
