// The stdout table of check / run (issue 43 item 8): at most `width` columns by default, with a
// short case id (the case name and the axes that vary among the cases of that name; the full id
// with -v and always in the JSON), skip and error reasons in the rows, and the timing columns only
// in a timed run.
#pragma once
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace punica::bench {

// For ids "name/op/key=value/...": "name" plus "/key=value" for every key whose value differs
// among the ids of the same name (the op has its own column). Unique with the op for distinct ids.
std::vector<std::string> short_case_ids(const std::vector<std::string>& ids);

// The '#' header lines, one row per case, the skip reasons grouped, and the totals line
// ("# cases N: pass P, fail F, skip S, error E; exit code X"). full_ids: the full ids, unclipped.
std::string format_results_table(const nlohmann::json& doc, bool full_ids, std::size_t width = 160);

}  // namespace punica::bench
