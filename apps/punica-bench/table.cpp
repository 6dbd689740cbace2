// The stdout table of check / run (see table.h).
#include "apps/punica-bench/table.h"
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include "apps/punica-bench/report.h"

namespace punica::bench {
namespace {

using json = nlohmann::json;

struct ParsedId {
  std::string name, op;
  std::vector<std::pair<std::string, std::string>> axes;  // in the id's order
  bool ok = false;
};
ParsedId parse_id(const std::string& id) {
  ParsedId p;
  std::vector<std::string> seg;
  std::size_t start = 0;
  for (;;) {
    const std::size_t slash = id.find('/', start);
    seg.push_back(id.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  if (seg.size() < 2) return p;
  p.name = seg[0];
  p.op = seg[1];
  for (std::size_t i = 2; i < seg.size(); ++i) {
    const std::size_t eq = seg[i].find('=');
    if (eq == std::string::npos && !p.axes.empty()) p.axes.back().second += "/" + seg[i];  // a value with a '/'
    else if (eq == std::string::npos) p.axes.emplace_back(seg[i], "");
    else p.axes.emplace_back(seg[i].substr(0, eq), seg[i].substr(eq + 1));
  }
  p.ok = true;
  return p;
}

// "%.4g" of a number, "-" for anything else; scale multiplies it first.
std::string cell(const json& v, int prec = 4, double scale = 1) {
  if (!v.is_number()) return "-";
  char b[48];
  std::snprintf(b, sizeof b, "%.*g", prec, v.get<double>() * scale);
  return b;
}
std::string str_at(const json& r, std::initializer_list<const char*> path) {
  const json& v = json_at(r, path);
  return v.is_string() ? v.get<std::string>() : v.is_null() ? std::string("-") : v.dump();
}

}  // namespace

std::vector<std::string> short_case_ids(const std::vector<std::string>& ids) {
  std::vector<ParsedId> parsed;
  for (const auto& id : ids) parsed.push_back(parse_id(id));
  // per case name: every key's values over the name's ids ("\x01" where an id lacks the key)
  std::map<std::string, std::map<std::string, std::set<std::string>>> values;
  std::map<std::string, std::size_t> count;
  for (const auto& p : parsed)
    if (p.ok) ++count[p.name];
  for (const auto& p : parsed) {
    if (!p.ok) continue;
    auto& keys = values[p.name];
    for (const auto& [k, v] : p.axes) keys[k].insert(v);
  }
  for (const auto& p : parsed) {
    if (!p.ok) continue;
    auto& keys = values[p.name];
    std::set<std::string> mine;
    for (const auto& kv : p.axes) mine.insert(kv.first);
    for (auto& [k, vals] : keys)
      if (!mine.count(k)) vals.insert("\x01");
  }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& p = parsed[i];
    if (!p.ok) { out.push_back(ids[i]); continue; }
    std::string s = p.name;
    for (const auto& [k, v] : p.axes)
      if (values[p.name][k].size() > 1) s += "/" + k + "=" + v;
    out.push_back(s);
  }
  return out;
}

std::string format_results_table(const json& doc, bool full_ids, std::size_t width) {
  std::ostringstream o;
  const json& tool = doc.contains("tool") ? doc["tool"] : json::object();
  const bool timed = json_at(doc, {"run", "options", "timing"}) != false;
  o << "# punica-bench " << tool.value("version", "") << " (git " << tool.value("git_sha", "")
    << (tool.value("git_dirty", false) ? "+dirty" : "") << "), backend " << str_at(doc, {"run", "backend"})
    << ", ranks " << str_at(doc, {"run", "world_size"}) << "; cuda " << tool.value("cuda_runtime", "") << ", nccl "
    << tool.value("nccl", "") << ", mpi " << str_at(doc, {"run", "mpi"}) << "\n";
  if (doc.contains("devices"))
    for (const auto& d : doc["devices"])
      o << "# rank " << d.value("rank", 0) << ": " << d.value("host", "") << " " << d.value("name", "")
        << (d.contains("pci_bus_id") ? " " + d["pci_bus_id"].get<std::string>() : "") << "\n";
  if (timed) {
    const json& c = json_at(doc, {"run", "ceilings"});
    o << "# ceilings: copy " << cell(json_at(c, {"copy_gb_per_s"})) << " GB/s, bf16 gemm "
      << cell(json_at(c, {"gemm_bf16_tflops"})) << " TFLOP/s, graph node " << cell(json_at(c, {"graph_node_us"}))
      << " us\n";
  }
  const json cases = doc.contains("cases") ? doc["cases"] : json::array();
  std::vector<std::string> ids;
  for (const auto& r : cases) ids.push_back(r.value("id", ""));
  const std::vector<std::string> shown = full_ids ? ids : short_case_ids(ids);
  if (!full_ids && shown != ids)
    o << "# id: the case name and the axes that vary among its cases (-v: full ids, as in the result JSON)\n";

  // columns: name, right-aligned?; the timing ones only in a timed run
  std::vector<std::pair<std::string, bool>> cols = {{"status", false}, {"op", false}, {"tokens", true},
                                                    {"dtype", false},  {"nwrong", true}, {"max_rel", true}};
  if (timed)
    for (const char* h : {"time_us", "batch_us", "floor_us", "floor%", "GB/s", "xcuBLAS"}) cols.emplace_back(h, true);
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> notes;  // the id column: id, then a skip or error reason
  std::vector<std::pair<std::string, int>> skips;  // reason, cases: in order of first appearance
  bool any_layer = false;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const json& r = cases[i];
    const std::string st = r.value("status", "");
    std::vector<std::string> row = {st, r.value("op", ""), cell(json_at(r, {"params", "num_tokens"}), 7),
                                    str_at(r, {"params", "dtype"}), cell(json_at(r, {"check", "nwrong"}), 8),
                                    cell(json_at(r, {"check", "max_rel_err"}), 2)};
    // Layer rows: the time columns are the LoRA part's, like the floor and floor% beside them (the
    // whole layer's time goes to the id column).
    const bool layer = json_at(r, {"timing", "lora_us"}).is_number();
    if (layer) any_layer = true;
    if (timed) {
      row.push_back(cell(layer ? json_at(r, {"timing", "lora_us"}) : json_at(r, {"timing", "time_us", "median"})));
      row.push_back(cell(layer ? json_at(r, {"timing", "lora_batch_us"}) : json_at(r, {"timing", "batch_time_us"})));
      row.push_back(cell(json_at(r, {"work", "floor_us"})));
      row.push_back(cell(json_at(r, {"metrics", "floor_fraction"}), 3, 100));
      row.push_back(cell(json_at(r, {"metrics", "gb_per_s"})));
      row.push_back(cell(json_at(r, {"metrics", "speedup_vs_cublas"}), 3));
    }
    rows.push_back(row);
    std::string note = shown[i];
    if (timed && layer && json_at(r, {"timing", "layer_us"}).is_number())
      note += "  (layer " + cell(json_at(r, {"timing", "layer_us"})) + " us)";
    const json& why = st == "skip" ? json_at(r, {"skip_reason"}) : json_at(r, {"error"});
    if ((st == "skip" || st == "error") && why.is_string()) {
      note += "  (" + st + ": " + why.get<std::string>() + ")";
      if (st == "skip") {
        auto it = std::find_if(skips.begin(), skips.end(), [&](const auto& s) { return s.first == why; });
        if (it == skips.end()) skips.emplace_back(why.get<std::string>(), 1);
        else ++it->second;
      }
    }
    notes.push_back(note);
  }
  std::vector<std::size_t> w(cols.size());
  for (std::size_t c = 0; c < cols.size(); ++c) {
    w[c] = cols[c].first.size();
    for (const auto& row : rows) w[c] = std::max(w[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& row, std::string id) {
    std::string s;
    for (std::size_t c = 0; c < cols.size(); ++c) {
      const std::string pad(w[c] - std::min(w[c], row[c].size()), ' ');
      s += (c ? " " : "") + (cols[c].second ? pad + row[c] : row[c] + pad);
    }
    s += "  ";
    if (!full_ids && s.size() + id.size() > width) {  // clip the id column, never the numbers
      const std::size_t room = width > s.size() + 3 ? width - s.size() - 3 : 0;
      id = id.substr(0, room) + "...";
    }
    return s + id + "\n";
  };
  std::vector<std::string> head;
  for (const auto& c : cols) head.push_back(c.first);
  o << line(head, "id");
  for (std::size_t i = 0; i < rows.size(); ++i) o << line(rows[i], notes[i]);
  if (timed && any_layer)
    o << "# layer rows: time_us, batch_us, floor_us and floor% are the LoRA part's; the layer's time is by the id\n";
  for (const auto& [why, n] : skips) o << "# skip (" << n << (n == 1 ? " case" : " cases") << "): " << why << "\n";
  const json& s = doc.contains("summary") ? doc["summary"] : json::object();
  o << "# cases " << s.value("cases", 0) << ": pass " << s.value("pass", 0) << ", fail " << s.value("fail", 0)
    << ", skip " << s.value("skip", 0) << ", error " << s.value("error", 0) << "; exit code " << s.value("exit_code", 0)
    << "\n";
  return o.str();
}

}  // namespace punica::bench
