// Checks made before any work (issue 43): the output path, the input files and the option values,
// so that a run refuses a bad argument at once (exit 2) instead of after every case.
#pragma once
#include <string>
#include <vector>

namespace punica::bench {

// -o PATH of check/run (and export -o, targets --json): Error(usage) when PATH is a directory,
// exists without `overwrite`, or names a folder that does not exist or cannot be written.
// "-" (stdout) and "" (no output) pass.
void check_output_path(const std::string& path, bool overwrite, const std::string& flag = "-o");

// An input file (scenario or result): Error(usage) "PATH: is a directory ..." for a directory,
// "cannot open PATH: <reason>" (strerror) when it cannot be opened for reading.
void check_input_file(const std::string& path, const std::string& what = "scenario");

// Option values: "" when `text` is a finite number >= lo (and, with integer, a whole number),
// else why not ("expected an integer >= 1, got -3"). The CLI's validators are made of it.
std::string number_at_least(const std::string& text, double lo, bool integer);

// The edit (Levenshtein) distance of two strings.
std::size_t edit_distance(const std::string& a, const std::string& b);
// The closest of `names` to `word` within distance 2 (a typo), or "" when none is that close.
std::string closest_name(const std::string& word, const std::vector<std::string>& names);

}  // namespace punica::bench
