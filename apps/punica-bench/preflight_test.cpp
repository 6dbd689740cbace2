// Unit tests of the checks made before any work (issue 43): output paths, input files, option
// values and the nearest subcommand; and of compare_runs (like for like, noise, missing / extra).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include "apps/punica-bench/compare.h"
#include "apps/punica-bench/preflight.h"
#include "kernels/common/error.h"

using namespace punica;
using namespace punica::bench;
namespace fs = std::filesystem;

namespace {
// The Error(usage) message of f(), or "" when it does not throw one.
template <class F>
std::string usage_error(F f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  return "";
}
struct TempDir {
  fs::path p = fs::temp_directory_path() / ("preflight_test." + std::to_string(::getpid()));
  TempDir() { fs::create_directories(p); }
  ~TempDir() {
    fs::permissions(p, fs::perms::owner_all);
    fs::remove_all(p);
  }
};
}  // namespace

TEST(CheckOutputPath, StdoutAndNothingPass) {
  EXPECT_EQ(usage_error([] { check_output_path("-", false); }), "");
  EXPECT_EQ(usage_error([] { check_output_path("", false); }), "");
}
TEST(CheckOutputPath, NewFileInAWritableFolderPasses) {
  TempDir d;
  const std::string f = (d.p / "x.json").string();
  EXPECT_EQ(usage_error([&] { check_output_path(f, false); }), "");
  EXPECT_FALSE(fs::exists(f));
  EXPECT_TRUE(fs::is_empty(d.p)) << "the write probe is removed";
}
TEST(CheckOutputPath, MissingFolderDirectoryAndExistingFileRefused) {
  TempDir d;
  EXPECT_NE(usage_error([&] { check_output_path((d.p / "no" / "x.json").string(), false); }).find("does not exist"),
            std::string::npos);
  EXPECT_NE(usage_error([&] { check_output_path(d.p.string(), true); }).find("is a directory"), std::string::npos);
  const std::string f = (d.p / "x.json").string();
  std::ofstream(f) << "{}";
  EXPECT_NE(usage_error([&] { check_output_path(f, false); }).find("already exists"), std::string::npos);
  EXPECT_EQ(usage_error([&] { check_output_path(f, true); }), "");
  EXPECT_NE(usage_error([&] { check_output_path(f + "/y.json", false); }).find("is not a folder"), std::string::npos);
}
TEST(CheckOutputPath, ReadOnlyFolderRefused) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes in a read-only folder";
  TempDir d;
  fs::permissions(d.p, fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_NE(usage_error([&] { check_output_path((d.p / "x.json").string(), false); }).find("cannot write in the folder"),
            std::string::npos);
}
TEST(CheckInputFile, DirectoryMissingAndUnreadable) {
  TempDir d;
  EXPECT_NE(usage_error([&] { check_input_file(d.p.string()); }).find(": is a directory"), std::string::npos);
  const std::string missing = (d.p / "none.json").string();
  EXPECT_EQ(usage_error([&] { check_input_file(missing); }).rfind("cannot open " + missing + ": No such file or directory", 0),
            0u);
  const std::string f = (d.p / "s.json").string();
  std::ofstream(f) << "{}";
  EXPECT_EQ(usage_error([&] { check_input_file(f); }), "");
  if (::geteuid() != 0) {  // root reads any file
    fs::permissions(f, fs::perms::none);
    EXPECT_NE(usage_error([&] { check_input_file(f); }).find("cannot open " + f + ": Permission denied"),
              std::string::npos);
  }
}
TEST(NumberAtLeast, RangesIntegersNaN) {
  EXPECT_EQ(number_at_least("3", 1, true), "");
  EXPECT_EQ(number_at_least("0", 0, true), "");
  EXPECT_NE(number_at_least("0", 1, true), "");
  EXPECT_NE(number_at_least("-3", 1, true), "");
  EXPECT_NE(number_at_least("1.5", 0, true), "");
  EXPECT_EQ(number_at_least("1.5", 0, false), "");
  EXPECT_NE(number_at_least("nan", 0, false), "");
  EXPECT_NE(number_at_least("inf", 0, false), "");
  EXPECT_NE(number_at_least("5x", 0, false), "");
  EXPECT_NE(number_at_least("", 0, false), "");
  EXPECT_EQ(number_at_least("-5", 0, false), "expected a number >= 0, got '-5'");
}
TEST(ClosestName, Typos) {
  const std::vector<std::string> cmds = {"list", "validate", "info", "check", "run", "compare", "targets", "export"};
  EXPECT_EQ(closest_name("chek", cmds), "check");
  EXPECT_EQ(closest_name("comapre", cmds), "compare");
  EXPECT_EQ(closest_name("rnu", cmds), "run");
  EXPECT_EQ(closest_name("zzzzzz", cmds), "");
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

namespace {
nlohmann::json tcase(const std::string& id, double med, double p10, double p90, const std::string& status = "pass") {
  return {{"id", id}, {"status", status}, {"timing", {{"time_us", {{"median", med}, {"p10", p10}, {"p90", p90}}}}}};
}
nlohmann::json rdoc(nlohmann::json cases, const std::string& backend = "cuda", const std::string& gpu = "NVIDIA H200",
                    bool timing = true) {
  return {{"schema", "punica-bench.result/1"},
          {"run", {{"backend", backend}, {"options", {{"timing", timing}}}}},
          {"devices", {{{"name", gpu}}}},
          {"cases", cases}};
}
}  // namespace

TEST(CompareRuns, IdenticalNoisyRunsAreTheSame) {
  // a wide spread (p10..p90 = 80..130) hides a 10% change; a narrow one does not
  auto a = rdoc({tcase("wide", 100, 80, 130), tcase("narrow", 100, 99, 101)});
  auto b = rdoc({tcase("wide", 110, 90, 140), tcase("narrow", 110, 109, 111)});
  auto r = compare_runs(a, b, {});
  EXPECT_EQ(r.matched, 2);
  EXPECT_EQ(r.within_noise, 1);
  EXPECT_EQ(r.regressions, 1);
  CompareOptions big;
  big.min_effect_pct = 15;
  EXPECT_EQ(compare_runs(a, b, big).regressions, 0);
  // faster past the noise is an improvement, never a regression
  EXPECT_EQ(compare_runs(b, a, {}).improvements, 1);
  EXPECT_EQ(compare_runs(b, a, {}).regressions, 0);
}
TEST(CompareRuns, BrokenIsARegressionWhateverTheTime) {
  auto a = rdoc({tcase("x", 100, 99, 101)});
  auto b = rdoc({tcase("x", 100, 99, 101, "fail")});
  EXPECT_EQ(compare_runs(a, b, {}).regressions, 1);
}
TEST(CompareRuns, MissingAndExtraCounted) {
  auto a = rdoc({tcase("x", 1, 1, 1), tcase("y", 1, 1, 1), tcase("z", 1, 1, 1)});
  auto b = rdoc({tcase("x", 1, 1, 1), tcase("w", 1, 1, 1)});
  auto r = compare_runs(a, b, {});
  EXPECT_EQ(r.matched, 1);
  EXPECT_EQ(r.missing, 2);
  EXPECT_EQ(r.extra, 1);
  EXPECT_NE(r.text.find("WARNING: 2 of A's cases are missing from B"), std::string::npos) << r.text;
}
TEST(CompareRuns, IncomparableFilesRefusedUnlessAllowed) {
  auto a = rdoc({tcase("x", 100, 99, 101)});
  EXPECT_NE(usage_error([&] { compare_runs(a, rdoc(a["cases"], "cpu"), {}); }).find("backend cuda vs cpu"),
            std::string::npos);
  EXPECT_NE(usage_error([&] { compare_runs(a, rdoc(a["cases"], "cuda", "NVIDIA H100"), {}); }).find("devices"),
            std::string::npos);
  // a `check` result (no timings) against a timed one: refused, and with --allow-mismatch statuses only
  nlohmann::json untimed = rdoc({{{"id", "x"}, {"status", "pass"}}}, "cuda", "NVIDIA H200", false);
  EXPECT_NE(usage_error([&] { compare_runs(untimed, a, {}); }).find("has no timings"), std::string::npos);
  CompareOptions allow;
  allow.allow_mismatch = true;
  auto r = compare_runs(untimed, a, allow);
  EXPECT_FALSE(r.timed);
  EXPECT_EQ(r.mismatches.size(), 1u);
  EXPECT_NE(r.text.find("statuses compared only"), std::string::npos) << r.text;
}
TEST(ResultTimings, TimedCaseCounts) {
  auto a = rdoc({tcase("x", 100, 99, 101), tcase("y", 5, 5, 5, "fail")});
  EXPECT_TRUE(result_is_timed(a));
  EXPECT_EQ(timed_case_count(a, false), 2u);
  EXPECT_EQ(timed_case_count(a, true), 1u);
  nlohmann::json untimed = rdoc({{{"id", "x"}, {"status", "pass"}}}, "cpu", "cpu", false);
  EXPECT_FALSE(result_is_timed(untimed));
  EXPECT_EQ(timed_case_count(untimed, false), 0u);
}
