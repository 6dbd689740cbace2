// punica-bench: check and time vLLM's multi-LoRA (Punica) ops and TP LoRA layers on the GPU
// (CUDA kernels) or the CPU (Eigen reference), single process or under mpirun.
// Exit codes (DESIGN §3): 0 pass, 1 wrong result, 2 bad usage/input, 3 performance gate,
// 4 environment cannot run it, 5 timeout, 6 internal/CUDA/NCCL/MPI error.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <regex>
#include <sstream>
#include "apps/punica-bench/backend/backend.h"
#include "apps/punica-bench/compare.h"
#include "apps/punica-bench/dist.h"
#include "apps/punica-bench/preflight.h"
#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/report.h"
#include "apps/punica-bench/targets.h"
#include "apps/punica-bench/runner.h"
#include "apps/punica-bench/schema.h"
#include "apps/punica-bench/registry.h"
#include "apps/punica-bench/scenario.h"
#include "apps/punica-bench/table.h"
#include "kernels/common/error.h"

using namespace punica;
using namespace punica::bench;

namespace {

struct CommonOpts {
  std::vector<std::string> files;
  std::string filter;
  std::vector<std::string> axes;
  int64_t seed = -1;
  std::string backend = "auto";
  std::string output;
  bool overwrite = false;
  bool print_repro = false;
  int verbose = 0;
  bool quiet = false;
  int iters = -1, warmup = -1;
  int64_t sample_rows = 0;
  double timeout = 0;
  std::string dump;
  bool dump_all = false;
  bool nan_padding = false;
  bool exact = false;
  bool no_baselines = false;
  std::vector<std::string> kernels;  // --kernel OP=KIND
  std::string inject_fault;
};

std::string iso_now() {
  std::time_t t = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return b;
}

std::vector<AxisOverride> overrides_of(const CommonOpts& o) {
  std::vector<AxisOverride> ov;
  for (auto& a : o.axes) ov.push_back(parse_axis_override(a));
  if (o.seed >= 0) ov.push_back({"seed", o.seed});
  return ov;
}

std::vector<Case> select_cases(const CommonOpts& o, std::vector<Scenario>& scenarios) {
  auto ov = overrides_of(o);
  for (auto& f : o.files) check_input_file(f);
  if (o.files.empty()) scenarios.push_back(default_scenario(ov));
  else
    for (auto& f : o.files) scenarios.push_back(load_scenario(f, ov));
  std::vector<Case> out;
  std::regex re;
  if (!o.filter.empty()) {
    try {
      re = std::regex(o.filter, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      fail(ErrorKind::usage, "-f " + o.filter + ": invalid regular expression (" + e.what() + ")");
    }
  }
  for (auto& s : scenarios)
    for (auto& c : s.cases)
      if (o.filter.empty() || std::regex_search(c.id, re)) out.push_back(c);
  if (!o.filter.empty() && out.empty())
    fail(ErrorKind::usage, "-f " + o.filter + ": the filter matches no case in the given scenario files");
  return out;
}

// An option's value range, checked when the command line is parsed (exit 2 before any work).
CLI::Validator at_least(double lo, bool integer) {
  return CLI::Validator([lo, integer](std::string& v) { return number_at_least(v, lo, integer); },
                        std::string(integer ? "INT" : "NUM") + ">=" + std::to_string(int64_t(lo)));
}

void add_common(CLI::App* sc, CommonOpts& o, bool running) {
  sc->add_option("scenarios", o.files, "Scenario JSON files (default: the built-in scenario)");
  sc->add_option("-f,--filter", o.filter, "Regular expression over case ids (ECMAScript, searched)");
  sc->add_option("-a,--axis", o.axes, "Override a field for every case: axis=value (JSON value; lists cross); repeatable")
      ->allow_extra_args(false);
  sc->add_option("--seed", o.seed, "Override the input seed of every case (an integer >= 0)")->check(at_least(0, true));
  if (!running) return;
  sc->add_option("--backend", o.backend, "cpu | cuda | auto (GPU when present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sc->add_option("-o,--output", o.output, "Write the result JSON (punica-bench.result/1) here; '-' = stdout");
  sc->add_flag("--overwrite", o.overwrite, "Replace an existing output file");
  sc->add_flag("--print-repro", o.print_repro, "Print a one-line command reproducing each case");
  sc->add_flag("-v,--verbose", o.verbose, "More detail on stderr, full case ids in the table");
  sc->add_flag("-q,--quiet", o.quiet, "Only failures on stderr");
  sc->add_option("--sample-rows", o.sample_rows,
                 "Check only N deterministic rows per case (large cases on the CPU; 0 = every row)")
      ->check(at_least(0, true));
  sc->add_option("--timeout", o.timeout,
                 "Abort every rank when one case (its collectives and rank agreement included) runs longer than "
                 "S seconds, naming a rank that stopped answering (exit 5; 0 = no timeout)")
      ->check(at_least(0, false));
  auto* dump = sc->add_option("--dump", o.dump, "Write inputs, expected and actual outputs of failing cases as .npy into DIR");
  sc->add_flag("--dump-all", o.dump_all, "With --dump: dump every case, not only failing ones")->needs(dump);
  sc->add_flag("--nan-padding", o.nan_padding, "Fill A/B beyond each adapter's true rank with NaN");
  sc->add_flag("--exact", o.exact, "Small-integer inputs, so that any mismatch is a real bug");
  sc->add_option("--kernel", o.kernels,
                 "shrink=KIND or expand=KIND: that kernel for every lora_shrink / lora_expand call (the ops and "
                 "the fully sharded layers) instead of the automatic choice, to rank kernels under this tool's "
                 "checks and timing (--backend cuda; recorded as run.options.kernels). " +
                     kernel_kinds_text() + ". A named kind runs in its general configuration "
                     "(the automatic choice also picks small-batch tile heights, e.g. the expand's 16- and 32-row "
                     "tiles, so auto can beat every named kind); one that cannot take a shape falls back to a more "
                     "general one; repeatable")
      ->allow_extra_args(false);
  sc->add_option("--inject-fault", o.inject_fault, "Test only: RANK:throw|hang|moe_<fault> (the MoE layer's sharding bugs, README)")->group("");
}

int cmd_list(const CommonOpts& o) {
  std::vector<Scenario> sc;
  auto cases = select_cases(o, sc);
  for (auto& c : cases)
    std::cout << c.id << (c.skip_reason.empty() ? "" : "   # skip: " + c.skip_reason) << "\n";
  std::cerr << "# " << cases.size() << " cases\n";
  return 0;
}

int cmd_validate(const std::vector<std::string>& files) {
  PUNICA_REQUIRE(!files.empty(), ErrorKind::usage, "validate: give at least one scenario file");
  int rc = 0;
  for (auto& f : files) {
    try {
      check_input_file(f);
      Scenario s = load_scenario(f);
      std::size_t skips = 0;
      for (auto& c : s.cases) skips += !c.skip_reason.empty();
      std::cout << "ok    " << f << ": " << s.cases.size() << " cases (" << skips << " skipped by crossing)\n";
    } catch (const Error& e) {
      std::cout << "error " << e.what() << "\n";
      rc = 2;
    }
  }
  return rc;
}

// "punica-bench 0.1.0 (git <sha>[+dirty], <build type>, CUDA archs <archs>)": info's first line and --version.
std::string version_line(const nlohmann::json& t) {
  return "punica-bench " + t["version"].get<std::string>() + " (git " + t["git_sha"].get<std::string>() +
         (t["git_dirty"].get<bool>() ? "+dirty" : "") + ", " + t["build_type"].get<std::string>() + ", CUDA archs " +
         t["cuda_archs"].get<std::string>() + ")";
}

int cmd_info() {
  nlohmann::json t = tool_info();
  std::cout << version_line(t) << "\n";
  std::cout << "cuda runtime " << t["cuda_runtime"].get<std::string>() << ", nccl " << t["nccl"].get<std::string>()
            << ", compiler " << t["compiler"].get<std::string>() << "\n";
  std::cout << "ops:\n";
  for (const OpSpec* op : registered_op_specs()) {
    std::cout << "  " << op->name << ": " << op->summary;
    if (op->kernel_kinds) {
      std::cout << " (--kernel kinds:";
      for (const auto& k : op->kernel_kinds()) std::cout << " " << k;
      std::cout << ")";
    }
    std::cout << "\n";
  }
  std::cout << "models:";
  for (auto& m : known_models()) std::cout << " " << m;
  std::cout << "\n";
  if (cuda_available()) {
    auto be = make_cuda_backend(nullptr, 0);
    std::cout << "gpu: " << be->device_info().dump() << "\n";
  } else {
    std::cout << "gpu: none (the cpu backend runs the Eigen reference)\n";
  }
  return 0;
}

// Before any case runs: a case whose tensors (with the host copies the check keeps: about three
// copies in all) cannot fit in the backend's available memory is a skip naming the bytes needed
// and the bytes available, instead of an allocation failure minutes into the run.
void skip_cases_too_large(std::vector<Case>& cases, const Backend& be, bool say) {
  const double avail = double(be.free_memory_bytes());
  int n = 0;
  for (auto& c : cases) {
    if (!c.skip_reason.empty()) continue;
    const double need = 3.0 * case_bytes_needed(c);
    if (need <= avail) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf, "needs ~%.3g GB of %s memory, %.3g GB available", need / 1e9,
                  be.name() == "cuda" ? "GPU" : "host", avail / 1e9);
    c.skip_reason = buf;
    if (say && n < 5) std::fprintf(stderr, "# too large, skipped: %s: %s\n", c.id.c_str(), buf);
    ++n;
  }
  if (say && n > 5) std::fprintf(stderr, "# too large, skipped: %d cases in all\n", n);
}

int cmd_check_run(const CommonOpts& o, bool timing, const std::vector<std::string>& argv) {
  std::vector<Scenario> scen;
  auto cases = select_cases(o, scen);  // bad input fails before any rank starts work
  const KernelChoice kchoice = parse_kernel_choice(o.kernels);
  bool mpi = Dist::launched_by_mpirun();
  // the output path before any work: the writer (rank 0) can create the file there
  if (Dist::launch_rank() == 0) check_output_path(o.output, o.overwrite);
  int argc = 0;
  char** av = nullptr;
  Dist& dist = Dist::init(&argc, &av);
  const bool root = dist.rank() == 0;
  // --timeout covers every collective of the run, not only the cases' (a rank that stopped anywhere)
  const bool watch = o.timeout > 0 && dist.size() > 1;
  if (watch) {
    dist.start_watchdog();
    dist.arm(o.timeout, "the run's setup (device information, ceilings)");
  }
  std::string backend = o.backend;
  if (backend == "auto") backend = cuda_available() ? "cuda" : "cpu";
  std::unique_ptr<Backend> be;
  if (backend == "cuda") {
    PUNICA_REQUIRE(cuda_available(), ErrorKind::environment, "--backend cuda: no CUDA device is available on this machine");
    be = make_cuda_backend(&dist, dist.local_rank());
  } else {
    be = make_cpu_backend(&dist);
  }
  be->set_kernel_choice(kchoice);  // a usage error on the cpu backend when a kernel is named
  skip_cases_too_large(cases, *be, root && !o.quiet);
  if (kchoice.any() && root && !o.quiet)
    std::fprintf(stderr, "# --kernel: lora_shrink %s, lora_expand %s (not the automatic choice)\n",
                 shrink_kernel_name(kchoice.shrink).c_str(), expand_kernel_name(kchoice.expand).c_str());
  RunOptions ro;
  ro.timing = timing;
  ro.iters = o.iters;
  ro.warmup = o.warmup;
  ro.sample_rows = o.sample_rows;
  ro.nan_padding = o.nan_padding;
  ro.exact = o.exact;
  ro.baselines = !o.no_baselines;
  ro.timeout_s = o.timeout;
  ro.dump_dir = o.dump;
  ro.dump_all = o.dump_all;
  ro.verbose = o.quiet ? -1 : o.verbose;
  ro.inject_fault = o.inject_fault;
  ro.print_repro = o.print_repro;
  {
    std::string pre = "punica-bench " + std::string(timing ? "run" : "check") + " --backend " + backend;
    for (auto& f : o.files) pre += " " + f;
    for (auto& a : o.axes) pre += " -a '" + a + "'";
    for (auto& k : o.kernels) pre += " --kernel " + k;
    if (o.seed >= 0) pre += " --seed " + std::to_string(o.seed);
    if (dist.size() > 1) pre = "mpirun -np " + std::to_string(dist.size()) + " " + pre;
    ro.repro_prefix = pre;
  }
  Runner runner(*be, &dist, ro);
  RunHeader hdr;
  hdr.started_at = iso_now();
  hdr.argv = argv;
  hdr.backend = backend;
  hdr.world_size = dist.size();
  hdr.launcher = mpi ? "mpirun" : "single";
  hdr.mpi = dist.mpi_version();
  hdr.options = {{"iters", o.iters}, {"warmup", o.warmup}, {"timing", timing}, {"sample_rows", o.sample_rows},
                 {"nan_padding", o.nan_padding}, {"exact", o.exact}, {"seed", o.seed},
                 {"axis_overrides", o.axes}, {"filter", o.filter}, {"kernels", kchoice.to_json()}};
  for (auto& s : scen) hdr.scenarios.push_back({s.path, s.name});
  {
    nlohmann::json me = be->device_info();
    me["rank"] = dist.rank();
    me["local_rank"] = dist.local_rank();
    me["host"] = dist.host();
    for (auto& s : dist.gather_strings(me.dump())) hdr.devices.push_back(nlohmann::json::parse(s));
  }
  nlohmann::json doc = result_document(hdr);
  if (timing) {
    if (root && !o.quiet) std::fprintf(stderr, "# measuring ceilings (copy bandwidth, bf16 GEMM, graph node)...\n");
    doc["run"]["ceilings"] = ceilings_record(runner.measure_ceilings());
  } else {
    doc["run"]["ceilings"] = ceilings_record(std::nullopt);
  }
  if (watch) dist.disarm();
  int pass = 0, failn = 0, skip = 0, err = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    auto out = runner.run_case(cases[i], int(i), int(cases.size()));
    if (out.status == "pass") ++pass; else if (out.status == "fail") ++failn;
    else if (out.status == "skip") ++skip; else ++err;
    doc["cases"].push_back(case_record(out));
    // A CUDA error is sticky: every later case would fail the same way. Stop here, say so.
    if (out.status == "error" && backend == "cuda" && out.error.rfind("CUDA error", 0) == 0) {
      std::fprintf(stderr, "punica-bench: stopping after a CUDA error; %zu case(s) not run\n",
                   cases.size() - i - 1);
      break;
    }
  }
  int rc = err ? 6 : failn ? 1 : (pass == 0 && skip > 0) ? 4 : 0;
  finish_result_document(doc, iso_now(), cases.size(), pass, failn, skip, err, rc);
  if (root) {
    if (o.output == "-") {
      write_json_atomic("-", doc, true);
    } else {
      std::cout << format_results_table(doc, o.verbose > 0);  // 160 columns; -v: full ids
      if (!o.output.empty()) {
        write_json_atomic(o.output, doc, o.overwrite);
        std::cout << "# wrote " << o.output << "\n";
      }
    }
    std::cout.flush();
  }
  if (watch) dist.arm(o.timeout, "the end of the run (the last barrier)");
  dist.barrier();
  Dist::finalize();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  CLI::App app{"punica-bench: check and time vLLM's multi-LoRA (Punica) kernels and TP LoRA layers\n"
               "exit codes: 0 pass, 1 wrong result, 2 bad usage/input, 3 performance regression or missed target (targets --strict),\n"
               "            4 cannot run here (no GPU / too few ranks), 5 timeout, 6 internal/CUDA/NCCL/MPI error"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::function<std::string()>([] { return version_line(tool_info()); }),
                       "Print the version, git sha and build, and exit");
  CommonOpts list_o, check_o, run_o;
  auto* list = app.add_subcommand("list", "List the case ids of scenario files (after -f and -a)");
  add_common(list, list_o, false);
  std::vector<std::string> vfiles;
  auto* validate = app.add_subcommand("validate", "Parse and validate scenario files (exit 2 on the first bad one)");
  validate->add_option("scenarios", vfiles, "Scenario JSON files")->required();
  auto* info = app.add_subcommand("info", "Build, library and device information; registered ops and models");
  auto* schema = app.add_subcommand("schema", "Print the scenario JSON schema generated from the op registry "
                                               "(scenarios/schema/scenario.schema.json is its output)");
  auto* check = app.add_subcommand("check", "Check every selected case against the reference (no timing)");
  add_common(check, check_o, true);
  auto* run = app.add_subcommand("run", "Check, then time every selected case against the floor and cuBLAS");
  add_common(run, run_o, true);
  run->add_option("--iters", run_o.iters, "Timed iterations per case (default: the scenario's)")->check(at_least(1, true));
  run->add_option("--warmup", run_o.warmup, "Warm-up iterations per case")->check(at_least(0, true));
  run->add_flag("--no-baselines", run_o.no_baselines, "Skip the cuBLAS baselines");
  std::string cmp_a, cmp_b;
  CompareOptions cmp_opt;
  auto* compare = app.add_subcommand(
      "compare", "Compare two result files by case id: matched, missing, extra; exit 3 on a regression beyond noise");
  compare->add_option("baseline", cmp_a, "Baseline result JSON")->required();
  compare->add_option("candidate", cmp_b, "Candidate result JSON")->required();
  compare->add_option("--threshold", cmp_opt.threshold_pct,
                      "Slowdown in percent that counts as a regression when it is also past the noise (default 5)")
      ->check(at_least(0, false));
  compare->add_option("--min-effect", cmp_opt.min_effect_pct,
                      "A change within +-PCT percent is noise, whatever the cases' own p10..p90 spreads say")
      ->check(at_least(0, false));
  compare->add_flag("--allow-mismatch", cmp_opt.allow_mismatch,
                    "Compare files of another backend, GPU model or timing mode anyway (warned); exit 2 without it");
  std::vector<std::string> tgt_in, tgt_names;
  std::string tgt_json;
  bool tgt_overwrite = false, tgt_strict = false, tgt_missed = false, tgt_by_tokens = false;
  auto* targets = app.add_subcommand(
      "targets", "Evaluate the issues' performance targets on result files (exit 3 with --strict when one is missed)");
  targets->add_option("results", tgt_in,
                      "Result JSON files (bench and/or layer runs); repeated runs of the same cases each count, "
                      "so a row reads met k of n runs")
      ->required();
  targets->add_option("-t,--target", tgt_names, "Only this target (repeat -t for more; definitions in targets.h)")
      ->allow_extra_args(false)
      ->check(CLI::IsMember(target_names()));
  targets->add_flag("--list-missed", tgt_missed, "Print every case that misses a target, with its value and bound");
  targets->add_flag("--by-tokens", tgt_by_tokens,
                    "Split the op targets' rows by token count, with each row's range of values");
  targets->add_option("--json", tgt_json, "Also write the report as JSON (punica-bench.targets/1) here");
  targets->add_flag("--overwrite", tgt_overwrite, "Replace an existing --json file");
  targets->add_flag("--strict", tgt_strict, "Exit 3 when any evaluated case misses its target");
  std::string exp_in, exp_fmt = "gbench", exp_out = "-";
  bool exp_overwrite = false;
  auto* exportc = app.add_subcommand("export", "Convert a result JSON for dashboards: gbench, csv, md, bmf, gha-time, gha-throughput");
  exportc->add_option("result", exp_in, "Result JSON")->required();
  exportc->add_option("--format", exp_fmt,
                      "gbench (Google Benchmark JSON) | csv | md | bmf (Bencher Metric Format) | "
                      "gha-time / gha-throughput (github-action-benchmark custom arrays)")
      ->check(CLI::IsMember({"gbench", "csv", "md", "bmf", "gha-time", "gha-throughput"}));
  exportc->add_option("-o,--output", exp_out, "Output file ('-' = stdout)");
  exportc->add_flag("--overwrite", exp_overwrite, "Replace an existing output file");

  // A mistyped subcommand: name the nearest one instead of CLI11's "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const auto* sc : app.get_subcommands({})) names.push_back(sc->get_name());
    const std::string word = argv[1];
    if (std::find(names.begin(), names.end(), word) == names.end()) {
      const std::string near = closest_name(word, names);
      std::string all;
      for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
      std::fprintf(stderr, "punica-bench: error: unknown command '%s'%s (commands: %s; see --help)\n", word.c_str(),
                   near.empty() ? "" : (": did you mean " + near + "?").c_str(), all.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  std::setvbuf(stderr, nullptr, _IOLBF, 0);
  try {
    if (*list) return cmd_list(list_o);
    if (*validate) return cmd_validate(vfiles);
    if (*info) return cmd_info();
    if (*schema) {
      std::cout << scenario_schema_text();
      return 0;
    }
    if (*check) return cmd_check_run(check_o, false, args);
    if (*run) return cmd_check_run(run_o, true, args);
    if (*compare) {
      check_input_file(cmp_a, "result");
      check_input_file(cmp_b, "result");
      auto a = load_result(cmp_a), b = load_result(cmp_b);
      auto rep = compare_runs(a, b, cmp_opt, cmp_a, cmp_b);
      std::cout << rep.text;
      std::cout.flush();
      for (const auto& m : rep.mismatches)
        std::fprintf(stderr, "punica-bench: warning: compare: not like for like: %s\n", m.c_str());
      if (rep.missing > 0)
        std::fprintf(stderr, "punica-bench: warning: compare: %d of %s's cases are missing from %s\n", rep.missing,
                     cmp_a.c_str(), cmp_b.c_str());
      PUNICA_REQUIRE(rep.matched > 0, ErrorKind::usage, "compare: no case id of " + cmp_b + " appears in " + cmp_a);
      return rep.regressions ? 3 : 0;
    }
    if (*targets) {
      std::vector<nlohmann::json> docs;
      if (!tgt_json.empty()) check_output_path(tgt_json, tgt_overwrite, "--json");
      for (const auto& f : tgt_in) {
        check_input_file(f, "result");
        docs.push_back(load_result(f));
        // the targets are the H200 issues' GPU targets: a CPU backend's times score nothing of them
        if (json_at(docs.back(), {"run", "backend"}) == "cpu")
          std::fprintf(stderr, "punica-bench: warning: %s is a cpu-backend result: the targets are GPU targets, "
                               "scored here on CPU times\n", f.c_str());
      }
      const TargetsReport rep = evaluate_targets(docs, tgt_names, tgt_missed, tgt_by_tokens);
      std::cout << rep.text;
      for (std::size_t i = 0; i < docs.size(); ++i)  // the targets are the automatic choice's
        if (result_times_fixed_kernels(docs[i]))
          std::cout << "# note: " << tgt_in[i] << " times fixed kernels (--kernel " << result_kernels(docs[i]).dump()
                    << "), not the automatic choice the targets are about\n";
      if (!tgt_json.empty()) write_json_atomic(tgt_json, rep.doc, tgt_overwrite);
      return tgt_strict && rep.met < rep.cases ? 3 : 0;
    }
    if (*exportc) {
      if (exp_out != "-") check_output_path(exp_out, exp_overwrite);
      check_input_file(exp_in, "result");
      auto doc = load_result(exp_in);
      // the dashboards' formats carry times: a result without any (from `check`) would export [] or {}
      const bool passing_only = exp_fmt != "gbench";
      if (exp_fmt == "gbench" || exp_fmt == "bmf" || exp_fmt.rfind("gha-", 0) == 0)
        PUNICA_REQUIRE(timed_case_count(doc, passing_only) > 0, ErrorKind::usage,
                       exp_in + ": no " + (passing_only ? "passing " : "") + "timed case (" +
                           (result_is_timed(doc) ? "every case failed, erred or was skipped"
                                                 : "a `check` result has no timings; make it with `run`") +
                           "): nothing to export as " + exp_fmt);
      std::string text = exp_fmt == "gbench"   ? export_gbench(doc)
                         : exp_fmt == "csv"    ? export_csv(doc)
                         : exp_fmt == "md"     ? export_md(doc)
                         : exp_fmt == "bmf"    ? export_bmf(doc)
                                               : export_gha(doc, exp_fmt == "gha-time");
      if (exp_out == "-") std::cout << text;
      else {
        PUNICA_REQUIRE(exp_overwrite || !std::ifstream(exp_out), ErrorKind::usage,
                       exp_out + ": output file already exists (pass --overwrite to replace it)");
        std::string tmp = exp_out + ".tmp";
        { std::ofstream f(tmp); PUNICA_REQUIRE(f, ErrorKind::usage, exp_out + ": cannot create"); f << text; }
        std::rename(tmp.c_str(), exp_out.c_str());
      }
      return 0;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "punica-bench: error: %s\n", e.what());
    if (Dist* d = Dist::instance(); d && d->size() > 1) d->abort(e.exit_code(), e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "punica-bench: internal error: %s\n", e.what());
    if (Dist* d = Dist::instance(); d && d->size() > 1) d->abort(6, e.what());
    return 6;
  }
  return 0;
}
