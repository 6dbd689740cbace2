// `punica-bench targets` (targets.h): the issues' performance targets over result documents.
#include "apps/punica-bench/targets.h"
#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include "apps/punica-bench/report.h"
#include "kernels/common/error.h"

namespace punica::bench {

const std::vector<std::string>& target_names() {
  static const std::vector<std::string> names = {
      "dense_prefill", "dense_decode",  "one_adapter_expand", "linear_chain_cold", "linear_chain_batch",
      "prefill_floor", "fully_sharded", "decode_gather",      "moe_prefill",       "moe_decode",
      "moe_vs_cublas", "moe_layer_overhead"};
  return names;
}

namespace {

// The number at `path`, or nan when a member is missing or not a number.
double jnum(const nlohmann::json& j, std::initializer_list<const char*> path) {
  const auto& v = json_at(j, path);
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}
std::string jstr(const nlohmann::json& j, const char* k) {
  const auto& v = json_at(j, {k});
  return v.is_string() ? v.get<std::string>() : std::string();
}
bool timed_pass(const nlohmann::json& c) { return jstr(c, "status") == "pass" && json_at(c, {"timing"}).is_object(); }
std::string fmt(double v, int prec = 3) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}
// The issues' bounds, shared by the checks and the summary's median column.
constexpr double kDenseCopy = 0.75;     // dense_prefill: copy fraction at least this
constexpr double kFlopFraction = 0.7;   // dense_prefill, moe_prefill: the FLOP term's fraction where it dominates
constexpr double kDenseBatch = 0.5;     // dense_decode: copy_batch_fraction at least this
constexpr double kCublasSlack = 1.03;   // one_adapter_expand: cold time at most this x cuBLAS's
constexpr double kFloorFraction = 0.8;  // prefill_floor: floor fraction at least this
constexpr double kGatherUs = 15.0;      // decode_gather: graph-captured all_gather at most this
constexpr double kShardedSlack = 1.1;   // fully_sharded: plain tp LoRA time + collective, plus 10%
constexpr double kMoeFraction = 0.7;    // moe_prefill: copy (or FLOP-floor) fraction at least this
constexpr double kMoeSlackUs = 2.0;     // moe_decode: graph node x kernels + this + floor / kMoeFraction
constexpr double kMoeOverheadPct = 15;  // moe_layer_overhead: LoRA overhead over the base MoE layer at most this
constexpr double kMoeGemmRate = 0.5;    // moe_layer_overhead: counted where the expert GEMMs reach this rate
// What a row's median is compared with: its target's bound (moe_decode: time over bound, 1).
double median_bound(const std::string& target, double median) {
  if (target == "dense_prefill") return kDenseCopy;
  if (target == "dense_decode") return kDenseBatch;
  if (target == "one_adapter_expand") return kCublasSlack;
  if (target == "prefill_floor") return kFloorFraction;
  if (target == "decode_gather") return kGatherUs;
  if (target == "moe_prefill") return kMoeFraction;
  if (target == "moe_decode") return 1.0;
  if (target == "moe_vs_cublas") return 1.0;
  if (target == "moe_layer_overhead") return kMoeOverheadPct;
  return median;  // no median for the other targets
}
// A missed case's value and its bound, printed with `prec` decimals or, where those would print
// both alike (0.7995 against 0.8 at 3 decimals reads "0.800 < 0.800"), with up to 4 more.
std::pair<std::string, std::string> fmt_apart(double v, double bound, int prec) {
  int p = prec;
  while (p < prec + 4 && fmt(v, p) == fmt(bound, p)) ++p;
  return {fmt(v, p), fmt(bound, p)};
}
std::string missed(double v, const char* rel, double bound, int prec, const char* unit = "") {
  const auto [a, b] = fmt_apart(v, bound, prec);
  return a + unit + " " + rel + " " + b + unit;
}
// The case id without its second segment (the op): the shape that ties a shrink, an expand and an
// add_lora_linear case of one scenario entry together.
std::string shape_key(const std::string& id) {
  const auto a = id.find('/');
  if (a == std::string::npos) return id;
  const auto b = id.find('/', a + 1);
  return id.substr(0, a) + (b == std::string::npos ? std::string() : id.substr(b));
}

// An op case's group: the op, or with by_tokens the op and its token count ("lora_shrink T=8192"),
// whose op and tokens `keys` keeps for the rows' order.
std::string op_group(const std::string& op, const nlohmann::json& c, bool by_tokens,
                     std::map<std::string, std::pair<std::string, double>>& keys) {
  if (!by_tokens) return op;
  const double t = jnum(c, {"params", "num_tokens"});
  const std::string g = op + " T=" + (t == t ? fmt(t, 0) : std::string("?"));
  keys.emplace(g, std::make_pair(op, t == t ? t : -1.0));
  return g;
}

// The rows by (target, group), each with the measured values its median is taken over.
struct Acc {
  std::map<std::pair<std::string, std::string>, TargetRow> rows;
  std::map<std::pair<std::string, std::string>, std::vector<double>> values;
  std::vector<std::pair<std::string, std::string>> order;  // first seen
  // value: what the median is taken over (nan: none)
  void add(const std::string& name, const std::string& group, bool met, const std::string& why,
           double value = std::numeric_limits<double>::quiet_NaN()) {
    const auto k = std::make_pair(name, group);
    auto it = rows.find(k);
    if (it == rows.end()) {
      order.push_back(k);
      TargetRow row;
      row.name = name;
      row.group = group;
      it = rows.emplace(k, std::move(row)).first;
    }
    ++it->second.cases;
    if (met) ++it->second.met;
    else it->second.missed.push_back(why);
    if (value == value) values[k].push_back(value);
  }
};

}  // namespace

TargetsReport evaluate_targets(const std::vector<nlohmann::json>& docs, const std::vector<std::string>& names,
                               bool list_missed, bool by_tokens) {
  Acc acc;
  std::map<std::string, std::pair<std::string, double>> group_keys;  // by_tokens: group -> (op, tokens)
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& doc : docs) {
    PUNICA_REQUIRE(doc.is_object() && doc.contains("cases") && doc["cases"].is_array(), ErrorKind::usage,
                   "targets: not a punica-bench result document (no cases[])");
    sources.push_back({{"git_sha", jstr(json_at(doc, {"tool"}), "git_sha")}, {"cases", doc["cases"].size()}});
    const double node = jnum(doc, {"run", "ceilings", "graph_node_us"});
    const double gemm_tflops = jnum(doc, {"run", "ceilings", "gemm_bf16_tflops"});
    // The FLOP term of a case's floor (work.flops at the measured GEMM rate), 0 when unknown.
    auto flop_us = [&](const nlohmann::json& c) {
      const double f = jnum(c, {"work", "flops"});
      return gemm_tflops > 0 && f == f ? f / (gemm_tflops * 1e6) : 0.0;
    };
    // ---- op cases (issue 47's targets, which replaced issue 3's floor fractions)
    std::map<std::string, std::map<std::string, const nlohmann::json*>> shapes;  // shape -> op -> case
    for (const auto& c : doc["cases"]) {
      const std::string op = jstr(c, "op"), id = jstr(c, "id");
      if (op != "lora_shrink" && op != "lora_expand" && op != "add_lora_linear") continue;
      if (!timed_pass(c)) continue;
      shapes[shape_key(id)][op] = &c;
      const std::string grp = op_group(op, c, by_tokens, group_keys);
      const double fl = jnum(c, {"work", "floor_us"}), med = jnum(c, {"timing", "time_us", "median"});
      if (fl >= 10 && med > 0) {
        // copy_fraction, or the FLOP term's fraction where the FLOP term of the floor dominates
        const double ft = flop_us(c);
        const bool flops = ft > fl;
        const double v = flops ? ft / med : jnum(c, {"metrics", "copy_fraction"});
        const double bound = flops ? kFlopFraction : kDenseCopy;
        if (v == v)
          acc.add("dense_prefill", grp, v >= bound,
                  id + ": " + (flops ? "FLOP floor fraction " : "copy fraction ") + missed(v, "<", bound, 3), v);
      }
      const double cbf = jnum(c, {"metrics", "copy_batch_fraction"});
      if (fl == fl && fl < 10 && cbf == cbf)
        acc.add("dense_decode", grp, cbf >= kDenseBatch,
                id + ": copy_batch_fraction " + missed(cbf, "<", kDenseBatch, 3), cbf);
      // one slice, one adapter: a plain y += x B^T, against cuBLAS's accumulating GEMM of that shape
      const auto& p = json_at(c, {"params"});
      const double cub = jnum(c, {"baseline", "cublas_us"});
      if (op == "lora_expand" && jnum(p, {"num_adapters"}) == 1 && jnum(p, {"num_slices"}) == 1 && cub > 0 &&
          med > 0)
        acc.add("one_adapter_expand", grp, med <= kCublasSlack * cub,
                id + ": time over cuBLAS's " + missed(med / cub, ">", kCublasSlack, 3), med / cub);
    }
    for (const auto& [key, ops] : shapes) {
      if (ops.size() < 3) continue;
      const auto& lin = *ops.at("add_lora_linear");
      const auto& sh = *ops.at("lora_shrink");
      const auto& ex = *ops.at("lora_expand");
      for (const bool cold : {true, false}) {
        auto t = [&](const nlohmann::json& c) {
          return cold ? jnum(c, {"timing", "time_us", "median"}) : jnum(c, {"timing", "batch_time_us"});
        };
        const double l = t(lin), chain = t(sh) + t(ex);
        if (l == l && chain == chain)
          acc.add(cold ? "linear_chain_cold" : "linear_chain_batch", op_group("add_lora_linear", lin, by_tokens, group_keys), l < chain,
                  jstr(lin, "id") + ": " + missed(l, ">=", chain, 2, " us"));
      }
    }
    // ---- MoE op cases (issue 44; FlashInfer's deltas, issue 45: moe_prefill and moe_decode)
    for (const auto& c : doc["cases"]) {
      const std::string op = jstr(c, "op"), id = jstr(c, "id");
      const bool delta = op == "bgmv_moe_gemm1_lora_delta" || op == "bgmv_moe_gemm2_lora_delta";
      if (op != "moe_lora_align" && op != "add_lora_fused_moe" && op != "add_lora_w13" && op != "add_lora_w2" && !delta)
        continue;
      if (!timed_pass(c)) continue;
      const std::string grp = op_group(op, c, by_tokens, group_keys);
      const double fl = jnum(c, {"work", "floor_us"}), med = jnum(c, {"timing", "time_us", "median"});
      if (fl >= 10 && med > 0) {
        // copy_fraction, or the FLOP floor's fraction where the FLOP term of the floor dominates
        const double ft = flop_us(c);
        const bool flops = ft > fl;
        const double v = flops ? ft / med : jnum(c, {"metrics", "copy_fraction"});
        if (v == v)
          acc.add("moe_prefill", grp, v >= kMoeFraction,
                  id + ": " + (flops ? "FLOP floor fraction " : "copy fraction ") + missed(v, "<", kMoeFraction, 3), v);
      }
      const double bt = jnum(c, {"timing", "batch_time_us"});
      if (fl == fl && fl < 10 && bt == bt && node == node) {
        // kernels launched: add_lora_w13's aligned path runs the alignment and the fused op; the
        // deltas' pairs path a shrink and an expand, the grouped path the alignment, a zero pass
        // and the tiles (gemm1) or a memset, the alignment, the tiles and the rounding pass (gemm2)
        // (files before timing.batch_nodes_per_call, the graph's own count, by the plan)
        const std::string plan = jstr(c, "plan");
        double kernels = op == "add_lora_w13" && plan.find("align+") != std::string::npos ? 2 : 1;
        if (delta) kernels = plan.find("grouped") == std::string::npos ? 2 : op == "bgmv_moe_gemm1_lora_delta" ? 3 : 4;
        const double nodes = jnum(c, {"timing", "batch_nodes_per_call"});
        if (nodes == nodes && nodes > 0) kernels = nodes;
        const double bound = node * kernels + kMoeSlackUs + fl / kMoeFraction;
        acc.add("moe_decode", grp, bt <= bound, id + ": " + missed(bt, ">", bound, 2, " us"), bt / bound);
      }
      const double sp = jnum(c, {"metrics", "speedup_vs_cublas_grouped"});
      if (op != "moe_lora_align" && !delta && sp == sp)
        acc.add("moe_vs_cublas", grp, sp > 1.0, id + ": cold speed-up over cuBLAS grouped " + missed(sp, "<=", 1.0, 2), sp);
    }
    // ---- layer cases
    std::map<std::string, const nlohmann::json*> layer_by_id;
    for (const auto& c : doc["cases"])
      if (jstr(c, "op") == "layer" && timed_pass(c)) layer_by_id[jstr(c, "id")] = &c;
    for (const auto& [id, cp] : layer_by_id) {
      const auto& c = *cp;
      const auto& p = json_at(c, {"params"});
      if (!p.is_object()) continue;
      const std::string phase = jstr(p, "phase"), module = jstr(p, "module");
      const double tp = jnum(p, {"tp"}), T = jnum(p, {"num_tokens"}), L = jnum(p, {"max_loras"});
      const bool fs = json_at(p, {"fully_sharded"}).is_boolean() && p["fully_sharded"].get<bool>();
      const bool r16 = json_at(p, {"ranks"}) == nlohmann::json::array({16});
      const std::string kind = module.empty() ? jstr(p, "layer") : module;  // gqa-tiny cases name no module
      const double lora = jnum(c, {"timing", "lora_us"});
      if (phase == "prefill" && (module == "qkv" || module == "gate_up") && (tp == 1 || tp == 2) && !fs && T == 8192 &&
          L == 8 && r16) {
        const double ff = jnum(c, {"metrics", "lora_floor_fraction"});
        if (ff == ff) {
          const auto [us, need] = fmt_apart(lora, lora * ff / kFloorFraction, 2);
          acc.add("prefill_floor", kind + " tp=" + fmt(tp, 0), ff >= kFloorFraction,
                  id + ": LoRA floor fraction " + missed(ff, "<", kFloorFraction, 3) + " (" + us + " us; " + fmt(kFloorFraction, 1) + " needs <= " +
                      need + " us)",
                  ff);
        }
      }
      // issue 46: the MoE layer's LoRA overhead, Mixtral-8x7B, T = 4096, 4 adapters of rank 16, tp 1,
      // plain, counted only where the base layer's expert GEMMs run at >= kMoeGemmRate of the GEMM rate
      const bool ep = json_at(p, {"expert_parallel"}).is_boolean() && p["expert_parallel"].get<bool>();
      if (jstr(p, "layer") == "fused_moe" && jstr(p, "model") == "mixtral-8x7b" && T == 4096 && tp == 1 && !fs && !ep &&
          r16 && jnum(p, {"num_adapters"}) == 4) {
        const double ov = jnum(c, {"metrics", "lora_overhead_pct"});
        const double rate = jnum(c, {"metrics", "base_gemm_rate_fraction"});
        if (ov == ov && rate == rate && rate >= kMoeGemmRate)
          acc.add("moe_layer_overhead", "mixtral-8x7b tp=1", ov <= kMoeOverheadPct,
                  id + ": LoRA overhead " + missed(ov, ">", kMoeOverheadPct, 2, " %") + " (expert GEMMs at " +
                      fmt(rate, 2) + " of the GEMM rate)",
                  ov);
      }
      if (fs && tp == 2) {
        std::string plain = id;
        const auto pos = plain.find("fully_sharded=1");
        if (pos != std::string::npos && lora == lora) {
          plain.replace(pos, 15, "fully_sharded=0");
          auto it = layer_by_id.find(plain);
          if (it != layer_by_id.end()) {
            // the sharded LoRA's collectives: timing.comm_*_us but not the base layer's comm_base_*
            // (the case's comm[] list would not do: a row layer's also holds the base all_reduce)
            double comm = 0;
            for (const auto& [k, v] : c["timing"].items())
              if (k.rfind("comm_", 0) == 0 && k.rfind("comm_base_", 0) != 0 && k.compare(k.size() - 3, 3, "_us") == 0 &&
                  k.find("_batch") == std::string::npos && v.is_number())
                comm += v.get<double>();
            const double bound = kShardedSlack * (jnum(*it->second, {"timing", "lora_us"}) + comm);
            if (bound == bound)
              acc.add("fully_sharded", phase + " " + kind, lora <= bound,
                      id + ": " + missed(lora, ">", bound, 2, " us"));
          }
        }
      }
      if (fs && tp == 2 && phase == "decode") {
        const double ag = jnum(c, {"timing", "comm_all_gather_batch_us"});
        if (ag == ag) acc.add("decode_gather", kind, ag <= kGatherUs, id + ": " + missed(ag, ">", kGatherUs, 2, " us"), ag);
      }
    }
  }
  TargetsReport rep;
  std::set<std::string> want(names.begin(), names.end());
  // the issues' order (target_names()), each target's groups as first seen
  const auto& all = target_names();
  auto rank = [&](const std::pair<std::string, std::string>& k) {
    return std::find(all.begin(), all.end(), k.first) - all.begin();
  };
  // with by_tokens, each op's groups by token count (the ops as first seen)
  std::vector<std::string> ops_seen;
  for (const auto& k : acc.order) {
    auto it = group_keys.find(k.second);
    if (it != group_keys.end() && std::find(ops_seen.begin(), ops_seen.end(), it->second.first) == ops_seen.end())
      ops_seen.push_back(it->second.first);
  }
  auto sort_key = [&](const std::string& g) {
    const auto& [op, t] = group_keys.at(g);
    return std::make_pair(std::find(ops_seen.begin(), ops_seen.end(), op) - ops_seen.begin(), t);
  };
  std::stable_sort(acc.order.begin(), acc.order.end(), [&](const auto& a, const auto& b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    if (!group_keys.count(a.second) || !group_keys.count(b.second)) return false;  // layer rows: as first seen
    return sort_key(a.second) < sort_key(b.second);
  });
  for (const auto& k : acc.order) {
    if (!want.empty() && !want.count(k.first)) continue;
    TargetRow r = acc.rows.at(k);
    auto v = acc.values.find(k);
    if (v != acc.values.end()) {
      r.median = stats(v->second).median;
      r.lo = *std::min_element(v->second.begin(), v->second.end());
      r.hi = *std::max_element(v->second.begin(), v->second.end());
    }
    rep.cases += r.cases;
    rep.met += r.met;
    rep.rows.push_back(std::move(r));
  }
  PUNICA_REQUIRE(rep.cases > 0, ErrorKind::usage,
                 "targets: no timed case that a target applies to (op cases of lora_shrink / lora_expand / "
                 "add_lora_linear, or layer cases), or no target of that name");
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%-20s %-22s %7s %7s %9s", "target", "group", "met", "cases", "median");
  o << line << (by_tokens ? "  range" : "") << "\n";
  for (const auto& r : rep.rows) {
    // the median against its target's bound, with the digits that tell them apart
    std::snprintf(line, sizeof line, "%-20s %-22s %7d %7d %9s", r.name.c_str(), r.group.c_str(), r.met, r.cases,
                  r.median >= 0 ? fmt_apart(r.median, median_bound(r.name, r.median), 3).first.c_str() : "-");
    o << line;
    if (by_tokens) {
      std::snprintf(line, sizeof line, "  %-13s", r.lo >= 0 ? (fmt(r.lo, 3) + "-" + fmt(r.hi, 3)).c_str() : "-");
      o << line;
    }
    o << "\n";
  }
  o << "# targets met in " << rep.met << " of " << rep.cases << " case checks"
    << " (median: copy fraction for dense_prefill / moe_prefill, copy_batch_fraction for dense_decode, time over"
       " cuBLAS's for one_adapter_expand, floor fraction for prefill_floor, time over bound for moe_decode, us for"
       " decode_gather)\n";
  if (list_missed)
    for (const auto& r : rep.rows)
      for (const auto& m : r.missed) o << "missed " << r.name << "  " << m << "\n";
  rep.text = o.str();
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : rep.rows)
    rows.push_back({{"target", r.name}, {"group", r.group}, {"met", r.met}, {"cases", r.cases},
                    {"median", r.median >= 0 ? nlohmann::json(r.median) : nlohmann::json()},
                    {"min", r.lo >= 0 ? nlohmann::json(r.lo) : nlohmann::json()},
                    {"max", r.hi >= 0 ? nlohmann::json(r.hi) : nlohmann::json()}, {"missed", r.missed}});
  rep.doc = {{"schema", "punica-bench.targets/1"}, {"sources", sources}, {"met", rep.met}, {"cases", rep.cases},
             {"targets", rows}};
  return rep;
}

}  // namespace punica::bench
