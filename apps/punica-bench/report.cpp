// Result document, table, exporters and compare (see report.h).
#include "apps/punica-bench/report.h"
#include "apps/punica-bench/backend/backend.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include "build_info.h"
#include "kernels/common/error.h"

namespace punica::bench {
namespace {
std::string num(const nlohmann::json& v, int prec = 4) {
  if (v.is_null() || !v.is_number()) return "-";
  char b[64];
  std::snprintf(b, sizeof b, "%.*g", prec, v.get<double>());
  return b;
}
std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) { if (c == '"') o += '"'; o += c; }
  return o + "\"";
}
}  // namespace

const nlohmann::json& json_at(const nlohmann::json& j, std::initializer_list<const char*> path) {
  static const nlohmann::json null;
  const nlohmann::json* p = &j;
  for (auto* k : path) {
    if (!p->is_object() || !p->contains(k)) return null;
    p = &(*p)[k];
  }
  return *p;
}

namespace {
nlohmann::json num_or_null(double v, bool ok) { return ok ? nlohmann::json(v) : nlohmann::json(nullptr); }
}  // namespace

nlohmann::json case_record(const CaseResult& r) {
  using nlohmann::json;
  const Case& c = *r.c;
  json rec = {{"id", c.id}, {"op", c.op}, {"case", c.name}, {"params", c.params}, {"status", r.status},
              {"skip_reason", r.skip_reason.empty() ? json(nullptr) : json(r.skip_reason)}};
  rec["params"]["num_tokens"] = c.num_tokens;
  rec["params"]["dtype"] = kernels::dtype_name(c.dtype);
  rec["params"]["tp"] = c.tp;
  rec["params"]["fully_sharded"] = c.fully_sharded;
  rec["params"]["layer"] = c.layer.empty() ? json(nullptr) : json(c.layer);
  if (r.status == "error") rec["error"] = r.error;
  if (!r.plan.empty()) rec["plan"] = r.plan;
  if (!r.repro.empty()) rec["repro"] = r.repro;
  if (r.check) {
    const CheckSummary& k = *r.check;
    json chk = {{"mode", k.mode}, {"reference", k.reference}, {"rtol", k.rtol}, {"nelems", k.nelems},
                {"nwrong", k.nwrong}, {"max_abs_err", k.max_abs_err}, {"max_rel_err", k.max_rel_err},
                {"atol", k.atol}, {"guard_ok", k.guard_ok}, {"untouched_ok", k.untouched_ok},
                {"sampled_rows", k.sampled_rows > 0 ? json(k.sampled_rows) : json(nullptr)}};
    if (!k.first_mismatches.empty()) chk["first_mismatches"] = k.first_mismatches;
    rec["check"] = chk;
  }
  if (r.work)
    rec["work"] = {{"bytes", r.work->bytes}, {"flops", r.work->flops}, {"tokens", r.work->tokens},
                   {"floor_us", r.floor_us}};
  if (!r.timing) return rec;
  const TimingResult& t = *r.timing;
  const Stats& s = t.time;
  const bool layer = !c.layer.empty();
  json tj = {{"method", t.method}, {"cache", t.rotated_copies > 1 ? "cold" : "warm"},
             {"rotated_copies", t.rotated_copies}, {"warmup_iters", t.warmup}, {"iters", t.iters},
             {"rank_reduce", "max"},
             {"time_us", {{"median", s.median}, {"p10", s.p10}, {"p90", s.p90}, {"min", s.min},
                          {"max", s.max}, {"mean", s.mean}, {"stdev", s.stdev}}},
             {"cv_pct", s.mean > 0 ? 100.0 * s.stdev / s.mean : 0.0},
             {"noisy", s.mean > 0 && 100.0 * s.stdev / s.mean > 5.0},
             {"batch_time_us", num_or_null(t.batch_us, t.batch_us >= 0)},
             {"batch_mode", t.batch_mode}, {"batch_calls", t.batch_calls},
             {"batch_nodes_per_call", num_or_null(t.batch_nodes, t.batch_nodes >= 0)},
             {"launches_held", t.launches_held}};
  std::map<std::string, double> part_us;
  for (const auto& [name, us] : t.part_us) {
    part_us[name] = us;
    tj[name + "_us"] = us;
  }
  for (const auto& [name, us] : t.part_batch_us) tj[name + "_batch_us"] = num_or_null(us, us >= 0);
  const double work_bytes = r.work ? r.work->bytes : 0, floor_us = r.floor_us;
  json m;
  m["floor_fraction"] = num_or_null(floor_us / s.median, s.median > 0 && floor_us > 0);
  m["gb_per_s"] = s.median > 0 ? work_bytes / (s.median * 1e3) : 0.0;
  m["tflops"] = s.median > 0 && r.work ? r.work->flops / (s.median * 1e6) : 0.0;
  m["tokens_per_s"] = s.median > 0 && r.work ? double(r.work->tokens) / (s.median * 1e-6) : 0.0;
  m["speedup_vs_cublas"] = nullptr;
  m["speedup_vs_cublas_grouped"] = nullptr;
  m["copy_fraction"] = nullptr;
  m["copy_batch_fraction"] = nullptr;
  if (r.baseline) {
    const BaselineResult& b = *r.baseline;
    rec["baseline"] = {{"cublas_us", num_or_null(b.cublas_us, b.cublas_us >= 0)},
                       {"cublas_grouped_us", num_or_null(b.cublas_grouped_us, b.cublas_grouped_us >= 0)},
                       {"cublas_grouped_batched_us",
                        num_or_null(b.cublas_grouped_batched_us, b.cublas_grouped_batched_us >= 0)},
                       {"cublas_gemm_graph_us", num_or_null(b.cublas_gemm_graph_us, b.cublas_gemm_graph_us >= 0)},
                       {"copy_us", num_or_null(b.copy_us, b.copy_us >= 0)},
                       {"copy_batch_us", num_or_null(b.copy_batch_us, b.copy_batch_us >= 0)},
                       {"launches_held", b.launches_held}};
    if (b.cublas_us >= 0 && s.median > 0) m["speedup_vs_cublas"] = b.cublas_us / s.median;
    if (b.cublas_grouped_us >= 0 && s.median > 0) m["speedup_vs_cublas_grouped"] = b.cublas_grouped_us / s.median;
    // 1 = as fast as a copy of the same bytes; the floor fraction a copy itself reaches is
    // work.floor_us / baseline.copy_us (`punica-bench targets` counts the cases where it meets 0.8)
    m["copy_fraction"] = num_or_null(b.copy_us / s.median, b.copy_us >= 0 && s.median > 0);
    m["copy_batch_fraction"] = num_or_null(b.copy_batch_us / t.batch_us, b.copy_batch_us >= 0 && t.batch_us > 0);
  }
  if (layer) {
    tj["layer_us"] = s.median;
    if (r.base_gemm_tflops >= 0) m["base_gemm_tflops"] = r.base_gemm_tflops;
    if (r.base_gemm_rate_fraction >= 0) m["base_gemm_rate_fraction"] = r.base_gemm_rate_fraction;
    if (part_us.count("base")) {
      const double base = part_us["base"];
      m["lora_overhead_pct"] = base > 0 ? 100.0 * (s.median - base) / base : 0.0;
    }
    if (part_us.count("lora") && part_us["lora"] > 0) {
      m["gb_per_s"] = work_bytes / (part_us["lora"] * 1e3);  // the work is the LoRA part's
      m["lora_floor_fraction"] = floor_us / part_us["lora"];
      m["floor_fraction"] = floor_us / part_us["lora"];
      // The work, the floor and the copy baseline are the LoRA part's: compare them with its time.
      const double lb = t.part_batch_us.count("lora") ? t.part_batch_us.at("lora") : -1;
      if (r.baseline) {
        m["copy_fraction"] = num_or_null(r.baseline->copy_us / part_us["lora"], r.baseline->copy_us >= 0);
        m["copy_batch_fraction"] = num_or_null(r.baseline->copy_batch_us / lb, r.baseline->copy_batch_us >= 0 && lb > 0);
      }
    }
    json comm = json::array();
    for (const auto& cm : r.comm) {
      const double algbw = cm.time_us > 0 ? cm.bytes / (cm.time_us * 1e3) : 0;
      const double factor = cm.op == "all_reduce" ? 2.0 * (cm.tp - 1) / cm.tp : double(cm.tp - 1) / cm.tp;
      comm.push_back({{"op", cm.op}, {"bytes", cm.bytes}, {"tp", cm.tp},
                      {"time_us", num_or_null(cm.time_us, cm.time_us > 0)},
                      {"graph_time_us", num_or_null(cm.graph_time_us, cm.graph_time_us > 0)},
                      {"algbw_gb_per_s", algbw}, {"busbw_gb_per_s", algbw * factor}});
    }
    rec["comm"] = comm;
  }
  rec["timing"] = tj;
  rec["metrics"] = m;
  return rec;
}

nlohmann::json result_document(const RunHeader& h) {
  nlohmann::json doc;
  doc["schema"] = "punica-bench.result/1";
  doc["tool"] = tool_info();
  doc["run"] = {{"started_at", h.started_at}, {"argv", h.argv}, {"backend", h.backend}, {"world_size", h.world_size},
                {"launcher", h.launcher}, {"mpi", h.mpi}, {"options", h.options}};
  nlohmann::json sj = nlohmann::json::array();
  for (auto& [path, name] : h.scenarios) sj.push_back({{"path", path}, {"name", name}});
  doc["run"]["scenarios"] = sj;
  nlohmann::json env = nlohmann::json::object();
  for (const char* k : {"CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "NCCL_DEBUG", "OMPI_COMM_WORLD_SIZE"})
    if (const char* v = std::getenv(k)) env[k] = v;
  doc["run"]["env"] = env;
  doc["devices"] = h.devices;
  doc["cases"] = nlohmann::json::array();
  return doc;
}

nlohmann::json ceilings_record(const std::optional<Ceilings>& c) {
  if (!c) return {{"copy_gb_per_s", nullptr}, {"gemm_bf16_tflops", nullptr}, {"graph_node_us", nullptr}};
  return {{"copy_gb_per_s", c->copy_gb_per_s}, {"gemm_bf16_tflops", c->gemm_bf16_tflops},
          {"graph_node_us", c->graph_node_us}};
}

void finish_result_document(nlohmann::json& doc, const std::string& finished_at, std::size_t cases, int pass,
                            int fail, int skip, int error, int exit_code) {
  doc["run"]["finished_at"] = finished_at;
  doc["summary"] = {{"cases", cases}, {"not_run", cases - std::size_t(pass + fail + skip + error)},
                    {"pass", pass}, {"fail", fail}, {"skip", skip}, {"error", error}, {"exit_code", exit_code}};
}

Stats stats(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto q = [&](double p) { return v[std::min(v.size() - 1, std::size_t(p * double(v.size() - 1) + 0.5))]; };
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.p10 = q(0.1); s.p90 = q(0.9); s.min = v.front(); s.max = v.back();
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  double var = 0;
  for (double x : v) var += (x - s.mean) * (x - s.mean);
  s.stdev = std::sqrt(var / double(v.size()));
  return s;
}

nlohmann::json tool_info() {
  const ToolkitVersions v = toolkit_versions();
  return {{"name", "punica-bench"},
          {"version", PUNICA_VERSION},
          {"git_sha", PUNICA_GIT_SHA},
          {"git_dirty", PUNICA_GIT_DIRTY},
          {"build_type", PUNICA_BUILD_TYPE},
          {"cuda_archs", PUNICA_CUDA_ARCHS},
          {"compiler", PUNICA_COMPILER},
          {"cuda_runtime", v.cuda_runtime},
          {"nccl", v.nccl}};
}

void write_json_atomic(const std::string& path, const nlohmann::json& doc, bool overwrite) {
  std::string text = doc.dump(2) + "\n";
  if (path == "-") {
    std::cout << text;
    std::cout.flush();
    return;
  }
  namespace fs = std::filesystem;
  PUNICA_REQUIRE(overwrite || !fs::exists(path), ErrorKind::usage,
                 path + ": output file already exists (pass --overwrite to replace it)");
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    PUNICA_REQUIRE(f, ErrorKind::usage, path + ": cannot create the output file");
    f << text;
    f.flush();
    PUNICA_REQUIRE(f.good(), ErrorKind::runtime, tmp + ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    fail(ErrorKind::runtime, path + ": rename failed: " + ec.message());
  }
}

nlohmann::json load_result(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  PUNICA_REQUIRE(f, ErrorKind::usage, path + ": cannot open the result file");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  // results/history (tag lab-archive) keeps its JSON gzipped: name the way to read it instead of a parse error at byte 1
  PUNICA_REQUIRE(!(text.size() >= 2 && uint8_t(text[0]) == 0x1f && uint8_t(text[1]) == 0x8b), ErrorKind::usage,
                 path + ": is gzip-compressed (results/history at tag lab-archive keeps its JSON gzipped): `gunzip -c " + path +
                     " > FILE.json` and pass FILE.json, or compare it with scripts/lab/ab_compare.py --pair OLD NEW");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(ErrorKind::usage, path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  PUNICA_REQUIRE(j.is_object(), ErrorKind::usage, path + ": /: expected a JSON object");
  PUNICA_REQUIRE(j.value("schema", std::string()) == "punica-bench.result/1", ErrorKind::usage,
                 path + ": /schema: expected \"punica-bench.result/1\"");
  PUNICA_REQUIRE(j.contains("cases") && j["cases"].is_array(), ErrorKind::usage, path + ": /cases: expected an array");
  return j;
}


std::string export_gbench(const nlohmann::json& doc) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  nlohmann::json out;
  out["context"] = {{"date", json_at(doc, {"run", "started_at"}).is_string() ? json_at(doc, {"run", "started_at"}) : nlohmann::json("")},
                    {"host_name", host},
                    {"executable", "punica-bench"},
                    {"num_cpus", 1},
                    {"mhz_per_cpu", 0},
                    {"cpu_scaling_enabled", false},
                    {"library_build_type", "release"},
                    {"punica_version", doc["tool"].value("version", "")},
                    {"git_sha", doc["tool"].value("git_sha", "")},
                    {"gpu", doc["devices"].empty() ? "" : doc["devices"][0].value("name", "")}};
  out["benchmarks"] = nlohmann::json::array();
  for (auto& r : doc["cases"]) {
    std::string st = r.value("status", "");
    if (st == "skip") continue;
    nlohmann::json b = {{"name", r["id"]}, {"run_name", r["id"]}, {"run_type", "iteration"}, {"repetitions", 1},
                        {"repetition_index", 0}, {"threads", 1}, {"time_unit", "us"}};
    const auto& med = json_at(r, {"timing", "time_us", "median"});
    b["iterations"] = json_at(r, {"timing", "iters"}).is_number() ? json_at(r, {"timing", "iters"}) : nlohmann::json(0);
    b["real_time"] = med.is_number() ? med.get<double>() : 0.0;
    b["cpu_time"] = b["real_time"];
    if (json_at(r, {"metrics", "gb_per_s"}).is_number()) b["bytes_per_second"] = json_at(r, {"metrics", "gb_per_s"}).get<double>() * 1e9;
    if (json_at(r, {"metrics", "tokens_per_s"}).is_number()) b["items_per_second"] = json_at(r, {"metrics", "tokens_per_s"});
    if (json_at(r, {"check", "nwrong"}).is_number()) b["nwrong"] = json_at(r, {"check", "nwrong"});
    if (json_at(r, {"metrics", "floor_fraction"}).is_number()) b["floor_fraction"] = json_at(r, {"metrics", "floor_fraction"});
    if (json_at(r, {"metrics", "copy_fraction"}).is_number()) b["copy_fraction"] = json_at(r, {"metrics", "copy_fraction"});
    if (st != "pass") {
      b["error_occurred"] = true;
      b["error_message"] = st == "fail" ? "wrong result: nwrong=" + num(json_at(r, {"check", "nwrong"}), 12)
                                        : r.value("error", std::string("error"));
    }
    out["benchmarks"].push_back(b);
  }
  return out.dump(2) + "\n";
}

std::string export_csv(const nlohmann::json& doc) {
  std::ostringstream o;
  o << "id,op,status,num_tokens,dtype,tp,fully_sharded,layer,nwrong,max_abs_err,max_rel_err,median_us,p10_us,"
       "p90_us,batch_time_us,floor_us,floor_fraction,gb_per_s,tflops,tokens_per_s,speedup_vs_cublas,"
       "speedup_vs_cublas_grouped,skip_reason,copy_us,copy_batch_us,copy_fraction,copy_batch_fraction\n";
  auto cell = [](const nlohmann::json& v) {
    if (v.is_null()) return std::string();
    if (v.is_string()) return csv_escape(v.get<std::string>());
    if (v.is_boolean()) return std::string(v.get<bool>() ? "1" : "0");
    return v.dump();
  };
  for (auto& r : doc["cases"]) {
    o << csv_escape(r.value("id", "")) << "," << r.value("op", "") << "," << r.value("status", "") << ","
      << cell(json_at(r, {"params", "num_tokens"})) << "," << cell(json_at(r, {"params", "dtype"})) << ","
      << cell(json_at(r, {"params", "tp"})) << "," << cell(json_at(r, {"params", "fully_sharded"})) << ","
      << cell(json_at(r, {"params", "layer"})) << "," << cell(json_at(r, {"check", "nwrong"})) << ","
      << cell(json_at(r, {"check", "max_abs_err"})) << "," << cell(json_at(r, {"check", "max_rel_err"})) << ","
      << cell(json_at(r, {"timing", "time_us", "median"})) << "," << cell(json_at(r, {"timing", "time_us", "p10"})) << ","
      << cell(json_at(r, {"timing", "time_us", "p90"})) << "," << cell(json_at(r, {"timing", "batch_time_us"})) << ","
      << cell(json_at(r, {"work", "floor_us"})) << "," << cell(json_at(r, {"metrics", "floor_fraction"})) << ","
      << cell(json_at(r, {"metrics", "gb_per_s"})) << "," << cell(json_at(r, {"metrics", "tflops"})) << ","
      << cell(json_at(r, {"metrics", "tokens_per_s"})) << "," << cell(json_at(r, {"metrics", "speedup_vs_cublas"})) << ","
      << cell(json_at(r, {"metrics", "speedup_vs_cublas_grouped"})) << "," << cell(r.value("skip_reason", nlohmann::json()))
      // the copy baseline (from fa30d5c on) after the older columns, so that readers by position keep working
      << "," << cell(json_at(r, {"baseline", "copy_us"})) << "," << cell(json_at(r, {"baseline", "copy_batch_us"})) << ","
      << cell(json_at(r, {"metrics", "copy_fraction"})) << "," << cell(json_at(r, {"metrics", "copy_batch_fraction"}))
      << "\n";
  }
  return o.str();
}

std::string export_md(const nlohmann::json& doc) {
  std::ostringstream o;
  o << "| id | status | tokens | time (µs) | batch (µs) | floor (µs) | % of floor | GB/s | × cuBLAS | nwrong |\n";
  o << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (auto& r : doc["cases"]) {
    const auto& ff = json_at(r, {"metrics", "floor_fraction"});
    o << "| `" << r.value("id", "") << "` | " << r.value("status", "") << " | " << num(json_at(r, {"params", "num_tokens"}), 8)
      << " | " << num(json_at(r, {"timing", "time_us", "median"})) << " | " << num(json_at(r, {"timing", "batch_time_us"}))
      << " | " << num(json_at(r, {"work", "floor_us"})) << " | " << (ff.is_number() ? num(ff.get<double>() * 100, 3) : "-")
      << " | " << num(json_at(r, {"metrics", "gb_per_s"})) << " | " << num(json_at(r, {"metrics", "speedup_vs_cublas"}), 3)
      << " | " << num(json_at(r, {"check", "nwrong"}), 10) << " |\n";
  }
  return o.str();
}

std::string export_bmf(const nlohmann::json& doc) {
  nlohmann::json out = nlohmann::json::object();
  for (auto& r : doc["cases"]) {
    if (r.value("status", "") != "pass") continue;
    const auto& t = json_at(r, {"timing", "time_us"});
    if (!t.is_object()) continue;
    nlohmann::json m;
    m["latency"] = {{"value", t["median"].get<double>() * 1e3}, {"lower_value", t["p10"].get<double>() * 1e3},
                    {"upper_value", t["p90"].get<double>() * 1e3}};
    if (json_at(r, {"metrics", "tokens_per_s"}).is_number()) m["throughput"] = {{"value", json_at(r, {"metrics", "tokens_per_s"})}};
    if (json_at(r, {"metrics", "floor_fraction"}).is_number())
      m["floor_fraction"] = {{"value", json_at(r, {"metrics", "floor_fraction"})}};
    out[r.value("id", "")] = m;
  }
  return out.dump(2) + "\n";
}

std::string export_gha(const nlohmann::json& doc, bool time) {
  nlohmann::json out = nlohmann::json::array();
  std::string gpu = doc["devices"].empty() ? "" : doc["devices"][0].value("name", "");
  for (auto& r : doc["cases"]) {
    if (r.value("status", "") != "pass") continue;
    const auto& t = json_at(r, {"timing", "time_us"});
    if (!t.is_object()) continue;
    std::string extra = "p10 " + num(t["p10"]) + " us, p90 " + num(t["p90"]) + " us; " + gpu + "; tp " +
                        num(json_at(r, {"params", "tp"}));
    if (time)
      out.push_back({{"name", r["id"]}, {"unit", "us"}, {"value", t["median"]},
                     {"range", "± " + num(t.value("stdev", nlohmann::json()))}, {"extra", extra}});
    else if (json_at(r, {"metrics", "gb_per_s"}).is_number())
      out.push_back({{"name", r["id"]}, {"unit", "GB/s"}, {"value", json_at(r, {"metrics", "gb_per_s"})}, {"extra", extra}});
  }
  return out.dump(2) + "\n";
}


}  // namespace punica::bench
