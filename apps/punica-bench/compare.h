// `punica-bench compare A B` (issue 43): two result files matched by case id, with what is
// matched, missing from B and extra in B; files that cannot be compared (another backend, another
// GPU model, one timed and one not) refused unless asked; a change inside the cases' measured noise
// counted as the same time, so that exit 3 means a regression beyond noise.
#pragma once
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace punica::bench {

struct CompareOptions {
  double threshold_pct = 5;    // a slowdown past this (and past the noise) is a regression
  double min_effect_pct = 0;   // a change within ±this is noise whatever the spreads say
  bool allow_mismatch = false; // compare incomparable files anyway (with warnings)
};

struct RunCompare {
  std::string text;                     // the table and the summary lines (stdout)
  std::vector<std::string> mismatches;  // why the files are not like for like (empty: comparable)
  int matched = 0, missing = 0, extra = 0;
  int regressions = 0, improvements = 0, within_noise = 0;
  bool timed = false;                   // both files hold timings (else status only)
};

// True when the document holds timings: run.options.timing, or else any case with timing.time_us.
bool result_is_timed(const nlohmann::json& doc);
// Cases with timing.time_us (passing ones only with passing_only).
std::size_t timed_case_count(const nlohmann::json& doc, bool passing_only);

// Error(usage) naming the mismatches when the files are not comparable and !allow_mismatch.
// A regression: a case that passed in A and fails (or errs) in B, or a median more than
// threshold_pct slower whose change is past the noise: the cases' own spreads (B's p10 above A's
// p90) and min_effect_pct. Faster likewise (B's p90 below A's p10).
RunCompare compare_runs(const nlohmann::json& a, const nlohmann::json& b, const CompareOptions& opt,
                        const std::string& name_a = "A", const std::string& name_b = "B");

}  // namespace punica::bench
