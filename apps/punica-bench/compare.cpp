// compare of two result files (see compare.h).
#include "apps/punica-bench/compare.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include "apps/punica-bench/backend/kernel_choice.h"
#include "apps/punica-bench/report.h"
#include "kernels/common/error.h"

namespace punica::bench {
namespace {

using json = nlohmann::json;

double num_or(const json& v, double dflt) { return v.is_number() ? v.get<double>() : dflt; }

std::string gpu_models(const json& doc) {
  std::set<std::string> names;
  if (doc.contains("devices") && doc["devices"].is_array())
    for (const auto& d : doc["devices"])
      if (d.is_object() && d.contains("name") && d["name"].is_string()) names.insert(d["name"].get<std::string>());
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string text_at(const json& doc, std::initializer_list<const char*> path) {
  const json& v = json_at(doc, path);
  return v.is_string() ? v.get<std::string>() : v.is_null() ? std::string() : v.dump();
}

// One case's timing: median, p10, p90 (p10 = p90 = median where the file lacks them); median < 0: none.
struct Timing {
  double median = -1, p10 = -1, p90 = -1;
};
Timing timing_of(const json& c) {
  Timing t;
  const json& tu = json_at(c, {"timing", "time_us"});
  if (!tu.is_object() || !tu.contains("median") || !tu["median"].is_number()) return t;
  t.median = tu["median"].get<double>();
  t.p10 = std::min(t.median, num_or(tu.value("p10", json()), t.median));
  t.p90 = std::max(t.median, num_or(tu.value("p90", json()), t.median));
  return t;
}

std::string fmt_num(double v, int prec = 4) {
  char b[48];
  std::snprintf(b, sizeof b, "%.*g", prec, v);
  return b;
}

}  // namespace

bool result_is_timed(const json& doc) {
  const json& t = json_at(doc, {"run", "options", "timing"});
  if (t.is_boolean()) return t.get<bool>();
  return timed_case_count(doc, false) > 0;
}

std::size_t timed_case_count(const json& doc, bool passing_only) {
  std::size_t n = 0;
  if (!doc.contains("cases") || !doc["cases"].is_array()) return 0;
  for (const auto& c : doc["cases"])
    if (timing_of(c).median >= 0 && (!passing_only || c.value("status", "") == "pass")) ++n;
  return n;
}

RunCompare compare_runs(const json& a, const json& b, const CompareOptions& opt, const std::string& name_a,
                        const std::string& name_b) {
  RunCompare rep;
  // Like for like: the same backend, GPU model and timing mode.
  const std::string ba = text_at(a, {"run", "backend"}), bb = text_at(b, {"run", "backend"});
  if (ba != bb) rep.mismatches.push_back("backend " + ba + " vs " + bb);
  const std::string ga = gpu_models(a), gb = gpu_models(b);
  if (ga != gb) rep.mismatches.push_back("devices '" + ga + "' vs '" + gb + "'");
  const bool ta = result_is_timed(a), tb = result_is_timed(b);
  if (ta != tb)
    rep.mismatches.push_back(std::string("timing: ") + name_a + (ta ? " is timed (run)" : " has no timings (check)") +
                             ", " + name_b + (tb ? " is timed (run)" : " has no timings (check)"));
  if (!rep.mismatches.empty() && !opt.allow_mismatch) {
    std::string why;
    for (const auto& m : rep.mismatches) why += (why.empty() ? "" : "; ") + m;
    fail(ErrorKind::usage, "compare: " + name_a + " and " + name_b + " are not like for like (" + why +
                               "); pass --allow-mismatch to compare them anyway");
  }
  rep.timed = ta && tb;

  std::map<std::string, const json*> in_a, in_b;
  std::vector<std::string> order_a;
  for (const auto& c : a["cases"]) {
    const std::string id = c.value("id", "");
    if (in_a.emplace(id, &c).second) order_a.push_back(id);
  }
  for (const auto& c : b["cases"]) in_b.emplace(c.value("id", ""), &c);

  std::ostringstream o;
  for (const auto& m : rep.mismatches) o << "# WARNING: not like for like: " << m << "\n";
  if (!rep.timed) o << "# no timings in " << (ta ? name_b : tb ? name_a : "either file") << ": statuses compared only\n";
  char line[640];
  const char* row = "%-9s %11s %11s %8s %7s  %s\n";
  std::snprintf(line, sizeof line, row, "verdict", rep.timed ? "A_us" : "A", rep.timed ? "B_us" : "B", "change%",
                "noise%", "id");
  o << line;
  auto emit = [&](const std::string& verdict, const std::string& ca, const std::string& cb, const std::string& ch,
                  const std::string& nz, const std::string& id) {
    std::snprintf(line, sizeof line, row, verdict.c_str(), ca.c_str(), cb.c_str(), ch.c_str(), nz.c_str(), id.c_str());
    o << line;
  };
  int slower = 0, broken = 0;
  for (const auto& id : order_a) {
    auto it = in_b.find(id);
    if (it == in_b.end()) continue;
    ++rep.matched;
    const json& ra = *in_a[id];
    const json& rb = *it->second;
    const std::string sa = ra.value("status", ""), sb = rb.value("status", "");
    const Timing xa = timing_of(ra), xb = timing_of(rb);
    const bool both = rep.timed && xa.median > 0 && xb.median > 0;
    std::string ca = both ? fmt_num(xa.median) : sa, cb = both ? fmt_num(xb.median) : sb, ch = "-", nz = "-";
    std::string verdict = "same";
    if (sa == "pass" && (sb == "fail" || sb == "error")) {
      verdict = "BROKEN";
      ++rep.regressions;
      ++broken;
    } else if (sa != "pass" && sa != "skip" && sb == "pass") {
      verdict = "fixed";
      ++rep.improvements;
    } else if (sa != sb) {
      verdict = sb == "skip" ? "skipped" : "status";
    } else if (both) {
      const double change = 100.0 * (xb.median - xa.median) / xa.median;
      // the change it takes for the central 80% of the two samples to stop overlapping
      const double spread = change >= 0 ? 100.0 * ((xa.p90 - xa.median) + (xb.median - xb.p10)) / xa.median
                                        : 100.0 * ((xa.median - xa.p10) + (xb.p90 - xb.median)) / xa.median;
      const double noise = std::max(spread, opt.min_effect_pct);
      ch = fmt_num(change, 3);
      nz = fmt_num(noise, 3);
      if (std::fabs(change) > opt.threshold_pct) {
        if (std::fabs(change) <= noise) {
          verdict = "noise";
          ++rep.within_noise;
        } else if (change > 0) {
          verdict = "SLOWER";
          ++rep.regressions;
          ++slower;
        } else {
          verdict = "faster";
          ++rep.improvements;
        }
      }
    }
    emit(verdict, ca, cb, ch, nz, id);
  }
  for (const auto& id : order_a)
    if (!in_b.count(id)) {
      ++rep.missing;
      emit("missing", in_a[id]->value("status", ""), "-", "-", "-", id);
    }
  for (const auto& c : b["cases"]) {
    const std::string id = c.value("id", "");
    if (in_a.count(id)) continue;
    ++rep.extra;
    emit("extra", "-", c.value("status", ""), "-", "-", id);
  }
  o << "# matched " << rep.matched << " of " << name_a << "'s " << order_a.size() << " cases; missing from "
    << name_b << " " << rep.missing << ", extra in " << name_b << " " << rep.extra << "\n";
  o << "# regressions " << rep.regressions << " (slower " << slower << ", broken " << broken << "), improvements "
    << rep.improvements << ", within noise " << rep.within_noise << " (threshold " << fmt_num(opt.threshold_pct)
    << "%, noise = the cases' p10..p90 spreads";
  if (opt.min_effect_pct > 0) o << " and at least " << fmt_num(opt.min_effect_pct) << "%";
  o << ")\n";
  if (rep.missing > 0)
    o << "# WARNING: " << rep.missing << " of " << name_a << "'s cases are missing from " << name_b << "\n";
  // Files from `--kernel` runs time fixed kernels: say so where the two files differ in that.
  const json ka = result_kernels(a), kb = result_kernels(b);
  if (ka != kb) o << "# note: the files time different kernels (--kernel): A " << ka.dump() << ", B " << kb.dump() << "\n";
  rep.text = o.str();
  return rep;
}

}  // namespace punica::bench
