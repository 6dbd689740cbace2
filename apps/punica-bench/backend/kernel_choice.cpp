#include "apps/punica-bench/backend/kernel_choice.h"
#include <utility>
#include "kernels/common/error.h"

namespace punica::bench {
namespace {

using SK = kernels::ShrinkKernel;
using EK = kernels::ExpandPrefillKernel;

// The kinds the kernels define, with the names they give them ("auto" first).
template <class E, std::size_t N>
std::vector<std::pair<std::string, E>> table_of(const E (&kinds)[N], const char* (*name)(E)) {
  std::vector<std::pair<std::string, E>> t;
  for (E k : kinds) t.emplace_back(name(k), k);
  return t;
}
const std::vector<std::pair<std::string, SK>>& shrink_table() {
  static const std::vector<std::pair<std::string, SK>> t = table_of<SK>(kernels::kShrinkKernels, kernels::kind_name);
  return t;
}
const std::vector<std::pair<std::string, EK>>& expand_table() {
  static const std::vector<std::pair<std::string, EK>> t = table_of<EK>(kernels::kExpandKernels, kernels::kind_name);
  return t;
}
template <class E>
std::vector<std::string> names_of(const std::vector<std::pair<std::string, E>>& t) {
  std::vector<std::string> v;
  for (auto& p : t) v.push_back(p.first);
  return v;
}
template <class E>
std::string name_of(const std::vector<std::pair<std::string, E>>& t, E k) {
  for (auto& p : t)
    if (p.second == k) return p.first;
  return "?";
}
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

const std::vector<std::string>& shrink_kernel_names() {
  static const std::vector<std::string> v = names_of(shrink_table());
  return v;
}
const std::vector<std::string>& expand_kernel_names() {
  static const std::vector<std::string> v = names_of(expand_table());
  return v;
}
std::string kernel_kinds_text() {
  return "shrink: " + join(shrink_kernel_names()) + "; expand: " + join(expand_kernel_names());
}
std::string shrink_kernel_name(SK k) { return name_of(shrink_table(), k); }
std::string expand_kernel_name(EK k) { return name_of(expand_table(), k); }

nlohmann::json KernelChoice::to_json() const {
  return {{"lora_shrink", shrink_kernel_name(shrink)}, {"lora_expand", expand_kernel_name(expand)}};
}

namespace {
// The kernel `kind` names in `table`, for `--kernel spec` of op `op` (given at most once).
template <class E>
E pick(const std::vector<std::pair<std::string, E>>& table, const std::string& op, const std::string& kind,
       const std::string& spec, bool& seen) {
  PUNICA_REQUIRE(!seen, ErrorKind::usage, "--kernel " + spec + ": " + op + " is given twice");
  seen = true;
  for (auto& p : table)
    if (p.first == kind) return p.second;
  fail(ErrorKind::usage, "--kernel " + spec + ": unknown " + op + " kernel '" + kind + "' (expected one of " +
                             join(names_of(table)) + ")");
}
}  // namespace

KernelChoice parse_kernel_choice(const std::vector<std::string>& specs) {
  KernelChoice c;
  bool seen_shrink = false, seen_expand = false;
  for (const std::string& s : specs) {
    const auto eq = s.find('=');
    const std::string op = eq == std::string::npos ? s : s.substr(0, eq);
    const std::string kind = eq == std::string::npos ? "" : s.substr(eq + 1);
    if (op == "shrink") c.shrink = pick(shrink_table(), op, kind, s, seen_shrink);
    else if (op == "expand") c.expand = pick(expand_table(), op, kind, s, seen_expand);
    else fail(ErrorKind::usage, "--kernel " + s + ": expected shrink=KIND or expand=KIND");
  }
  return c;
}

nlohmann::json result_kernels(const nlohmann::json& result) {
  const auto run = result.find("run");
  if (run != result.end() && run->is_object()) {
    const auto opts = run->find("options");
    if (opts != run->end() && opts->is_object()) {
      const auto k = opts->find("kernels");
      if (k != opts->end() && k->is_object()) return *k;
    }
  }
  return KernelChoice{}.to_json();
}
bool result_times_fixed_kernels(const nlohmann::json& result) { return result_kernels(result) != KernelChoice{}.to_json(); }

}  // namespace punica::bench
