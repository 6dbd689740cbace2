// Scenario files (schema punica-bench.scenario/1, DESIGN §4, ANCHORS §8.5): defaults merged into
// each case, list-valued fields crossed in canonical field order, shapes resolved from the SPEC §7.1
// model presets, stable case ids, and the deterministic adapter/request layout (vLLM's LoRAMapping:
// adapter slots, per-request slot, per-token slot) that every backend and rank derives alone.
#include "apps/punica-bench/scenario.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "kernels/common/error.h"
#include "kernels/common/hash_rng.h"
#include "apps/punica-bench/registry.h"

namespace punica::bench {
namespace {

using json = nlohmann::json;

const char* const kSchema = "punica-bench.scenario/1";

// The shared fields in canonical order (order = 10 x index; the registry's op fields slot in by
// their own order): lists cross in this order (first = outermost loop) and declared axes appear in
// case ids in this order.
const std::vector<std::string> kSharedFields = {
    "name", "op", "model", "module", "", "hidden", "slices", "num_slices", "num_heads",
    "num_kv_heads", "head_dim", "vocab", "", "phase", "num_requests",
    "tokens_per_request", "num_tokens", "max_loras", "num_adapters", "active_loras_hint", "ranks", "max_rank",
    "popularity", "no_lora_fraction", "none_slices", "scale", "add_inputs", "offset_start", "dtype",
    "intermediate_dtype", "tp", "fully_sharded", "seed", "warmup", "iters"};

// Every field, shared and op-introduced, in canonical order (built after the entries registered).
const std::vector<std::string>& all_fields() {
  static const std::vector<std::string> v = [] {
    std::vector<std::pair<int, std::string>> f;
    for (size_t i = 0; i < kSharedFields.size(); ++i)
      if (!kSharedFields[i].empty()) f.push_back({int(i) * 10, kSharedFields[i]});
    for (const auto& o : registered_op_fields()) f.push_back({o.order, o.name});
    std::stable_sort(f.begin(), f.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> out;
    for (auto& e : f) out.push_back(e.second);
    return out;
  }();
  return v;
}
const FieldSpec* op_field(const std::string& key) {
  static const std::vector<FieldSpec> v = registered_op_fields();
  for (const auto& f : v)
    if (f.name == key) return &f;
  return nullptr;
}

const std::vector<std::string> kModules = {"qkv", "o", "gate_up", "down", "embedding", "lm_head"};
const std::vector<std::string> kPopularity = {"uniform", "zipf", "sorted", "round_robin"};
const std::vector<std::string> kPhases = {"prefill", "decode"};
const std::vector<std::string> kTopKeys = {"schema", "name", "description", "defaults", "cases"};

// SPEC §7.1.
const std::vector<ModelPreset> kModels = {
    {"llama-3-8b", 4096, 32, 8, 128, 14336, 128256, 0, 0, 0},
    {"llama-3-70b", 8192, 64, 8, 128, 28672, 128256, 0, 0, 0},
    {"qwen2.5-7b", 3584, 28, 4, 128, 18944, 152064, 0, 0, 0},
    {"mixtral-8x7b", 4096, 32, 8, 128, 0, 32000, 8, 2, 14336},
    {"qwen3-30b-a3b", 2048, 32, 4, 128, 0, 151936, 128, 8, 768},
    // MLA attention (head_dim 0: qkv / o are not the plain projections); 64 routed experts (+2 shared)
    {"deepseek-v2-lite", 2048, 16, 0, 0, 10944, 102400, 64, 6, 1408},
    {"gqa-tiny", 1024, 16, 2, 64, 2816, 4096, 0, 0, 0},
};

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}
std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}
// Fields whose single value is itself a list: they cross only when given a list of lists.
bool list_valued(const std::string& k) {
  if (const FieldSpec* f = op_field(k)) return f->list_valued;
  return k == "slices" || k == "ranks" || k == "none_slices";
}
bool timing_only(const std::string& k) { return k == "warmup" || k == "iters"; }

[[noreturn]] void bad(const std::string& file, const std::string& path, const std::string& what) {
  throw Error(ErrorKind::usage, file + ": " + (path.empty() ? "/" : path) + ": " + what);
}

std::string show(const json& v) {
  std::string s = v.dump();
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}
std::string got(const json& v) {
  const char* t = v.is_number_integer() ? "integer"
                  : v.is_number_float() ? "number"
                                        : v.type_name();
  return std::string(", got ") + t + " " + show(v);
}

// Edit distance with adjacent transpositions ("rnak" -> "ranks" is 2), for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}
std::string unknown_key_msg(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t bd = 3;
  for (const auto& k : known) {
    size_t d = edit_distance(key, k);
    if (d < bd) { bd = d; best = k; }
  }
  if (!best.empty()) return "unknown key (did you mean \"" + best + "\"?)";
  return "unknown key (expected one of: " + join(known, ", ") + ")";
}

// Shortest decimal that reads back as the same double; integral values without a point.
std::string fmt_double(double d) {
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15)
    return std::to_string(static_cast<long long>(d));
  char buf[40];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  return buf;
}

// ---- typed readers (every failure names file, JSON path and what was expected) ----
constexpr int64_t kMaxSize = int64_t(1) << 40;
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

int64_t want_int(const std::string& file, const std::string& path, const json& v, int64_t lo,
                 int64_t hi) {
  auto expect = [&] {
    std::string e = lo == 1 ? "a positive integer" : lo == 0 ? "a non-negative integer"
                                                             : "an integer";
    return "expected " + e + (hi < kMaxSize ? " <= " + std::to_string(hi) : std::string());
  };
  if (!v.is_number_integer()) bad(file, path, expect() + got(v));
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(hi) || int64_t(u) < lo) bad(file, path, expect() + got(v));
    return int64_t(u);
  }
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(file, path, expect() + got(v));
  return x;
}
double want_number(const std::string& file, const std::string& path, const json& v, double lo,
                   double hi, const char* expect) {
  if (!v.is_number()) bad(file, path, std::string("expected ") + expect + got(v));
  double x = v.get<double>();
  if (!(x >= lo && x <= hi)) bad(file, path, std::string("expected ") + expect + got(v));
  return x;
}
bool want_bool(const std::string& file, const std::string& path, const json& v) {
  if (!v.is_boolean()) bad(file, path, "expected true or false" + got(v));
  return v.get<bool>();
}
std::string want_string(const std::string& file, const std::string& path, const json& v) {
  if (!v.is_string()) bad(file, path, "expected a string" + got(v));
  return v.get<std::string>();
}
std::string want_enum(const std::string& file, const std::string& path, const json& v,
                      const std::vector<std::string>& options) {
  if (!v.is_string() || !contains(options, v.get<std::string>()))
    bad(file, path, "expected one of " + join(options, "|") + got(v));
  return v.get<std::string>();
}
kernels::DType want_dtype(const std::string& file, const std::string& path, const json& v) {
  kernels::DType t{};
  if (!v.is_string() || !kernels::parse_dtype(v.get<std::string>(), t))
    bad(file, path, "expected one of fp16|bf16|fp32" + got(v));
  return t;
}
// An integer (shorthand for a one-element list) or a list of integers.
std::vector<int64_t> want_int_list(const std::string& file, const std::string& path, const json& v,
                                   int64_t lo, int64_t hi, bool allow_empty) {
  std::vector<int64_t> out;
  if (v.is_number_integer()) {
    out.push_back(want_int(file, path, v, lo, hi));
    return out;
  }
  if (!v.is_array()) bad(file, path, "expected a list of integers" + got(v));
  if (v.empty() && !allow_empty) bad(file, path, "expected a non-empty list of integers, got []");
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(want_int(file, path + "/" + std::to_string(i), v[i], lo, hi));
  return out;
}
Popularity want_popularity(const std::string& file, const std::string& path, const json& v) {
  Popularity p;
  if (v.is_string()) {
    p.kind = want_enum(file, path, v, kPopularity);
    return p;
  }
  if (!v.is_object())
    bad(file, path,
        "expected one of " + join(kPopularity, "|") + " or an object {kind, zipf_alpha}" + got(v));
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it.key() != "kind" && it.key() != "zipf_alpha")
      bad(file, path + "/" + it.key(), unknown_key_msg(it.key(), {"kind", "zipf_alpha"}));
  if (!v.contains("kind")) bad(file, path + "/kind", "missing required field (expected one of " +
                                                         join(kPopularity, "|") + ")");
  p.kind = want_enum(file, path + "/kind", v["kind"], kPopularity);
  if (v.contains("zipf_alpha")) {
    if (p.kind != "zipf") bad(file, path + "/zipf_alpha", "expected only with kind zipf");
    p.zipf_alpha = want_number(file, path + "/zipf_alpha", v["zipf_alpha"], 1e-9, 1e9,
                               "a positive number");
  }
  return p;
}

// ---- one value of one field, and where it was written ----
struct Alt {
  json v;
  std::string path;  // JSON path ("/cases/3/tp/1") or the CLI spot ("-a tp")
};

// A value of an op-introduced field against its registered schema (the subset the entries use:
// string enums, bounded integers and numbers, booleans, lists of bounded integers).
void check_by_schema(const std::string& file, const std::string& p, const json& v, const json& sch) {
  const std::string type = sch.value("type", "");
  auto lo = [&](const json& s, double d) { return s.contains("minimum") ? s["minimum"].get<double>() : d; };
  auto hi = [&](const json& s, double d) { return s.contains("maximum") ? s["maximum"].get<double>() : d; };
  if (type == "string") {
    if (sch.contains("enum")) want_enum(file, p, v, sch["enum"].get<std::vector<std::string>>());
    else want_string(file, p, v);
  } else if (type == "integer") {
    want_int(file, p, v, int64_t(lo(sch, 0)), int64_t(hi(sch, double(kMaxSize))));
  } else if (type == "number") {
    const std::string range = "a number in [" + fmt_double(lo(sch, -1e30)) + ", " + fmt_double(hi(sch, 1e30)) + "]";
    want_number(file, p, v, lo(sch, -1e30), hi(sch, 1e30), range.c_str());
  } else if (type == "boolean") {
    want_bool(file, p, v);
  } else if (type == "array") {
    const json& it = sch.value("items", json::object());
    want_int_list(file, p, v, int64_t(lo(it, 0)), int64_t(hi(it, double(kMaxSize))), sch.value("minItems", 0) == 0);
  }
}

// Type- and range-check a single (already un-crossed) value of a field.
void check_value(const std::string& file, const std::string& key, const Alt& a) {
  const json& v = a.v;
  const std::string& p = a.path;
  if (key == "name") {
    std::string s = want_string(file, p, v);
    if (s.empty() || s.find_first_of("/ \t\n=") != std::string::npos)
      bad(file, p, "expected a non-empty name without '/', '=' or spaces" + got(v));
  } else if (key == "op") {
    want_enum(file, p, v, registered_ops());
  } else if (key == "model") {
    want_enum(file, p, v, known_models());
  } else if (key == "module") {
    want_enum(file, p, v, kModules);
  } else if (key == "phase") {
    want_enum(file, p, v, kPhases);
  } else if (key == "hidden" || key == "vocab") {
    want_int(file, p, v, 1, kMaxSize);
  } else if (key == "num_heads" || key == "num_kv_heads" || key == "head_dim" ||
             key == "max_loras" || key == "max_rank" || key == "tp" || key == "iters") {
    want_int(file, p, v, 1, kMaxInt);
  } else if (key == "num_slices") {
    want_int(file, p, v, 1, 64);
  } else if (key == "num_adapters" || key == "warmup") {
    want_int(file, p, v, 0, kMaxInt);
  } else if (key == "num_requests" || key == "num_tokens" || key == "offset_start") {
    want_int(file, p, v, 0, kMaxSize);
  } else if (key == "tokens_per_request") {
    want_int(file, p, v, 1, kMaxSize);
  } else if (key == "slices") {
    want_int_list(file, p, v, 1, kMaxSize, false);
  } else if (key == "ranks") {
    want_int_list(file, p, v, 1, kMaxInt, false);
  } else if (key == "none_slices") {
    auto s = want_int_list(file, p, v, 0, 63, true);
    std::set<int64_t> u(s.begin(), s.end());
    if (u.size() != s.size()) bad(file, p, "expected distinct slice indices" + got(v));
  } else if (key == "popularity") {
    want_popularity(file, p, v);
  } else if (key == "no_lora_fraction") {
    want_number(file, p, v, 0.0, 1.0, "a number in [0, 1]");
  } else if (key == "scale") {
    want_number(file, p, v, -1e30, 1e30, "a finite number");
  } else if (key == "add_inputs" || key == "fully_sharded" || key == "active_loras_hint") {
    want_bool(file, p, v);
  } else if (key == "dtype" || key == "intermediate_dtype") {
    want_dtype(file, p, v);
  } else if (key == "seed") {
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
      bad(file, p, "expected a non-negative integer" + got(v));
  } else if (const FieldSpec* f = op_field(key)) {
    check_by_schema(file, p, v, f->value_schema);
  }
}

// The alternatives one field contributes to the cartesian product.
std::vector<Alt> alternatives(const std::string& file, const std::string& key, const Alt& a) {
  std::vector<Alt> out;
  bool cross = a.v.is_array();
  if (cross && list_valued(key))
    cross = std::any_of(a.v.begin(), a.v.end(), [](const json& e) { return e.is_array(); });
  if (cross && key == "name") bad(file, a.path, "expected a string (name cannot be a list)" + got(a.v));
  if (!cross) {
    out.push_back(a);
  } else {
    if (a.v.empty()) bad(file, a.path, "expected a non-empty list of values to cross, got []");
    for (size_t i = 0; i < a.v.size(); ++i) out.push_back({a.v[i], a.path + "/" + std::to_string(i)});
  }
  for (const auto& alt : out) check_value(file, key, alt);
  return out;
}

// Id rendering of a declared value: booleans 0/1, lists joined with 'x', dtypes canonical.
std::string id_value(const std::string& key, const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
  if (key == "dtype" || key == "intermediate_dtype") {
    kernels::DType t{};
    kernels::parse_dtype(v.get<std::string>(), t);
    return kernels::dtype_name(t);
  }
  if (key == "popularity") return popularity_name(want_popularity("", "", v));
  if (v.is_array()) {
    if (v.empty()) return "none";
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + v[i].dump();
    return s;
  }
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt_double(v.get<double>());
  return v.dump();
}

// Builds one crossed case: resolves sizes, applies the combination rules, renders the id.
class CaseBuilder final : public CaseContext {
 public:
  struct Pick {
    Alt alt;
    bool crossed = false;
  };
  CaseBuilder(const std::string& file, const std::string& case_path,
              std::map<std::string, Pick> picks)
      : file_(file), case_path_(case_path), f_(std::move(picks)) {}

  Case build();

  // CaseContext (the registry entries' hooks)
  Case& c() override { return c_; }
  bool has(const std::string& k) const override { return f_.count(k) != 0; }
  int64_t i64(const std::string& k, int64_t dflt) const override {
    return has(k) ? (v(k).is_number_unsigned() ? int64_t(v(k).get<uint64_t>()) : v(k).get<int64_t>())
                  : dflt;
  }
  const json& value(const std::string& k) const override { return v(k); }
  void skip(const std::string& why) override {
    if (c_.skip_reason.empty()) c_.skip_reason = why;
  }
  // A combination rule between fields: a skip if any of them is crossed (the combination exists
  // only because lists crossed), else an error at the first of them that was written.
  void problem(const std::string& why, const std::vector<std::string>& keys) override {
    for (const auto& k : keys)
      if (has(k) && f_.at(k).crossed) return skip(why);
    for (const auto& k : keys)
      if (has(k)) bad(file_, path(k), why);
    bad(file_, case_path_, why);
  }
  [[noreturn]] void missing(const std::string& what) override {
    bad(file_, case_path_, "missing required field " + what + " for op " + c_.op +
                               (c_.layer.empty() ? std::string() : " (layer " + c_.layer + ")"));
  }
  std::string id_value(const std::string& key, const json& v) const override {
    return punica::bench::id_value(key, v);
  }

 private:
  const json& v(const std::string& k) const { return f_.at(k).alt.v; }
  std::string path(const std::string& k) const { return has(k) ? f_.at(k).alt.path : case_path_; }
  std::string str(const char* k) const { return has(k) ? v(k).get<std::string>() : std::string(); }
  std::vector<int64_t> list(const char* k) const {
    return has(k) ? want_int_list(file_, path(k), v(k), 0, kMaxSize, true) : std::vector<int64_t>{};
  }
  void resolve_batch();
  void resolve_adapters();
  void resolve_shapes();
  void applicability();

  const std::string& file_;
  std::string case_path_;
  std::map<std::string, Pick> f_;
  Case c_;
  const ModelPreset* model_ = nullptr;
  const OpSpec* spec_ = nullptr;
};

void CaseBuilder::resolve_batch() {
  c_.tokens_per_request = i64("tokens_per_request", 1);
  if (has("num_requests")) {
    c_.num_requests = i64("num_requests", 0);
    c_.num_tokens = c_.num_requests * c_.tokens_per_request;
    if (c_.num_tokens > kMaxSize) bad(file_, path("num_requests"), "expected num_requests * tokens_per_request <= 2^40");
    if (has("num_tokens") && i64("num_tokens", 0) != c_.num_tokens) {
      problem("expected num_tokens = num_requests * tokens_per_request = " +
                  std::to_string(c_.num_tokens) + ", got " + std::to_string(i64("num_tokens", 0)),
              {"num_tokens", "num_requests", "tokens_per_request"});
    }
  } else if (has("num_tokens")) {
    c_.num_tokens = i64("num_tokens", 0);
    if (c_.num_tokens % c_.tokens_per_request != 0)
      problem("expected num_tokens to be a multiple of tokens_per_request " +
                  std::to_string(c_.tokens_per_request) + ", got " + std::to_string(c_.num_tokens),
              {"num_tokens", "tokens_per_request"});
    c_.num_requests = c_.num_tokens / c_.tokens_per_request;
    c_.num_tokens = c_.num_requests * c_.tokens_per_request;
  } else {
    bad(file_, case_path_, "missing required field num_requests (or num_tokens)");
  }
  c_.phase = has("phase") ? str("phase") : (c_.tokens_per_request > 1 ? "prefill" : "decode");
}

void CaseBuilder::resolve_adapters() {
  if (!has("max_loras") && !has("num_adapters"))
    bad(file_, case_path_, "missing required field max_loras (the number of adapter slots)");
  c_.max_loras = int(i64("max_loras", i64("num_adapters", 0)));
  c_.num_adapters = int(i64("num_adapters", c_.max_loras));
  if (c_.max_loras < 1) bad(file_, path("num_adapters"), "expected max_loras >= 1 (set max_loras)");
  if (c_.num_adapters > c_.max_loras)
    problem("expected num_adapters <= max_loras " + std::to_string(c_.max_loras) + ", got " +
                std::to_string(c_.num_adapters),
            {"num_adapters", "max_loras"});
  c_.ranks.clear();
  for (int64_t r : has("ranks") ? list("ranks") : std::vector<int64_t>{16}) c_.ranks.push_back(int(r));
  int maxr = *std::max_element(c_.ranks.begin(), c_.ranks.end());
  c_.max_rank = int(i64("max_rank", maxr));
  if (maxr > c_.max_rank)
    problem("expected every rank <= max_rank " + std::to_string(c_.max_rank) + ", got rank " +
                std::to_string(maxr),
            {"ranks", "max_rank"});
  if (has("popularity")) c_.popularity = want_popularity(file_, path("popularity"), v("popularity"));
  c_.no_lora_fraction = has("no_lora_fraction") ? v("no_lora_fraction").get<double>() : 0.0;
  c_.none_slices.clear();
  for (int64_t s : list("none_slices")) c_.none_slices.push_back(int(s));
  c_.scale = has("scale") ? float(v("scale").get<double>()) : 1.0f;
  c_.add_inputs = has("add_inputs") ? v("add_inputs").get<bool>() : true;
  c_.active_loras_hint = has("active_loras_hint") ? v("active_loras_hint").get<bool>() : false;
  c_.offset_start = i64("offset_start", 0);
  if (has("dtype")) c_.dtype = want_dtype(file_, path("dtype"), v("dtype"));
  if (has("intermediate_dtype"))
    c_.intermediate_dtype = want_dtype(file_, path("intermediate_dtype"), v("intermediate_dtype"));
  c_.tp = int(i64("tp", 1));
  c_.fully_sharded = has("fully_sharded") ? v("fully_sharded").get<bool>() : false;
  c_.seed = has("seed") ? v("seed").get<uint64_t>() : 0;
  c_.warmup = int(i64("warmup", c_.warmup));
  c_.iters = int(i64("iters", c_.iters));
}

void CaseBuilder::resolve_shapes() {
  const std::string& op = c_.op;
  const std::string& module = c_.module;
  const std::string& layer = c_.layer;
  const ModelPreset* m = model_;
  // Model alone: defaults for hidden, vocab and heads.
  int64_t hidden = m ? m->hidden : 0, vocab = m ? m->vocab : 0;
  int nh = m ? m->num_heads : 0, nkv = m ? m->num_kv_heads : 0, hd = m ? m->head_dim : 0;
  std::vector<int64_t> slices;
  bool module_exists = true;
  if (!module.empty()) {
    if (!m) bad(file_, path("module"), "expected a model preset alongside module (module " + module +
                                           " takes its sizes from the model)");
    const int64_t q = int64_t(m->num_heads) * m->head_dim, kv = int64_t(m->num_kv_heads) * m->head_dim;
    if ((module == "qkv" || module == "o") && m->head_dim == 0) {
      module_exists = false;
      skip("model " + m->name + " uses multi-head latent attention: module " + module + " is not a plain projection");
    } else if (module == "qkv") {
      hidden = m->hidden;
      slices = {q, kv, kv};
    } else if (module == "o") {
      hidden = q;
      slices = {m->hidden};
    } else if (module == "gate_up" || module == "down") {
      if (m->intermediate == 0) {
        module_exists = false;
        skip("model " + m->name + " has no dense MLP: module " + module + " does not exist");
      } else if (module == "gate_up") {
        hidden = m->hidden;
        slices = {m->intermediate, m->intermediate};
      } else {
        hidden = m->intermediate;
        slices = {m->hidden};
      }
    } else if (module == "embedding") {
      hidden = m->hidden;
      slices = {m->hidden};
    } else if (module == "lm_head") {
      hidden = m->hidden;
      slices = {m->vocab};
    }
    // Explicit sizes must agree with what the module gives.
    auto agree = [&](const char* k, int64_t derived) {
      if (module_exists && has(k) && i64(k, 0) != derived)
        problem("expected " + std::string(k) + " " + std::to_string(derived) + " as module " +
                    module + " of model " + m->name + " gives, got " + std::to_string(i64(k, 0)),
                {k, "module", "model"});
    };
    agree("hidden", hidden);
    if (module == "embedding" || module == "lm_head") agree("vocab", vocab);
    if (has("slices") && module_exists && list("slices") != slices)
      problem("expected slices " + id_value("slices", json(slices)) + " as module " + module +
                  " of model " + m->name + " gives",
              {"slices", "module", "model"});
  }
  if (has("hidden")) hidden = i64("hidden", 0);
  if (has("vocab")) vocab = i64("vocab", 0);
  if (has("num_heads")) nh = int(i64("num_heads", 0));
  if (has("num_kv_heads")) nkv = int(i64("num_kv_heads", 0));
  if (has("head_dim")) hd = int(i64("head_dim", 0));
  c_.out_features = i64("out_features", 0);
  c_.hidden = hidden;
  c_.vocab = vocab;
  c_.num_heads = nh;
  c_.num_kv_heads = nkv;
  c_.head_dim = hd;
  // The op's own defaults (and the slices it implies when the case names none).
  std::vector<int64_t> op_slices = spec_->defaults ? spec_->defaults(*this) : std::vector<int64_t>{};
  if (has("slices")) {
    slices = list("slices");
  } else if (module.empty()) {
    if (has("num_slices")) {
      if (hidden > 0) slices.assign(size_t(i64("num_slices", 1)), hidden);
    } else {
      slices = op_slices;
    }
  }
  if (has("num_slices") && module_exists && !slices.empty() &&
      int64_t(slices.size()) != i64("num_slices", 0))
    problem("expected num_slices to match the " + std::to_string(slices.size()) + " slices, got " +
                std::to_string(i64("num_slices", 0)),
            {"num_slices", "slices", "module"});
  c_.hidden = hidden;
  c_.vocab = vocab;
  c_.slices = slices;
  c_.num_heads = nh;
  c_.num_kv_heads = nkv;
  c_.head_dim = hd;
  if (!module_exists) return;

  // The sizes the op needs (after the model/module derivation).
  if (spec_->require) spec_->require(*this);
  // Slice indices of None sub-LoRAs must exist.
  if (!c_.slices.empty())
    for (int s : c_.none_slices)
      if (size_t(s) >= c_.slices.size())
        problem("expected none_slices indices < " + std::to_string(c_.slices.size()) +
                    " (the number of slices), got " + std::to_string(s),
                {"none_slices", "slices", "num_slices", "module", "op", "layer"});
}

// Whether module, op and the op's own fields fit together (a skip: a combination, not a bad value).
void CaseBuilder::applicability() {
  if (spec_->applicable) spec_->applicable(*this);
  if (!spec_->multi_rank) {
    if (c_.tp > 1) skip("tp > 1 applies to op=layer only (kernel ops run on one device)");
    if (c_.fully_sharded) skip("fully_sharded applies to op=layer only");
  }
}

Case CaseBuilder::build() {
  c_.file = file_;
  c_.name = str("name");
  c_.op = str("op");
  c_.model = str("model");
  c_.module = str("module");
  c_.layer = str("layer");
  if (!c_.model.empty()) model_ = find_model(c_.model);
  spec_ = find_op(c_.op);
  if (spec_ == nullptr) bad(file_, path("op"), "expected one of " + join(registered_ops(), "|"));
  // Fields that only some ops take.
  for (const auto& [key, pick] : f_) {
    std::vector<std::string> owners = field_owners(key);
    if (owners.empty() || contains(owners, c_.op)) continue;
    if (key == "active_loras_hint" && !pick.alt.v.get<bool>()) continue;  // false = not given
    std::string list;
    for (size_t i = 0; i < owners.size(); ++i)
      list += (i == 0 ? "" : i + 1 == owners.size() ? " or " : ", ") + owners[i];
    problem("expected " + key + " only with op " + list + ", got op " + c_.op, {key, "op"});
  }
  resolve_batch();
  resolve_adapters();
  resolve_shapes();
  applicability();

  // Id: every declared axis in canonical order (not name/op, not timing-only fields).
  c_.id = c_.name + "/" + c_.op;
  for (const auto& k : all_fields()) {
    if (k == "name" || k == "op" || timing_only(k) || !f_.count(k)) continue;
    c_.id += "/" + k + "=" + id_value(k, f_.at(k).alt.v);
  }

  json p = json::object();
  if (!c_.model.empty()) p["model"] = c_.model;
  if (!c_.module.empty()) p["module"] = c_.module;
  if (!c_.layer.empty()) p["layer"] = c_.layer;
  p["hidden"] = c_.hidden;
  p["slices"] = c_.slices;
  p["num_slices"] = c_.slices.size();
  if (c_.num_heads) {
    p["num_heads"] = c_.num_heads;
    p["num_kv_heads"] = c_.num_kv_heads;
    p["head_dim"] = c_.head_dim;
  }
  p["vocab"] = c_.vocab;
  p["out_features"] = c_.out_features;
  p["phase"] = c_.phase;
  p["num_requests"] = c_.num_requests;
  p["tokens_per_request"] = c_.tokens_per_request;
  p["num_tokens"] = c_.num_tokens;
  p["max_loras"] = c_.max_loras;
  p["num_adapters"] = c_.num_adapters;
  p["active_loras_hint"] = c_.active_loras_hint;
  p["ranks"] = c_.ranks;
  p["max_rank"] = c_.max_rank;
  p["popularity"] = popularity_name(c_.popularity);
  p["no_lora_fraction"] = c_.no_lora_fraction;
  p["none_slices"] = c_.none_slices;
  p["scale"] = c_.scale;
  p["add_inputs"] = c_.add_inputs;
  p["offset_start"] = c_.offset_start;
  p["dtype"] = kernels::dtype_name(c_.dtype);
  p["intermediate_dtype"] = kernels::dtype_name(c_.intermediate_dtype);
  p["tp"] = c_.tp;
  p["fully_sharded"] = c_.fully_sharded;
  p["seed"] = c_.seed;
  // The op's own fields, as given (its entry reads them from here).
  for (const auto& f : registered_op_fields())
    if (has(f.name) && f.name != "layer") p[f.name] = v(f.name);
  c_.params = std::move(p);
  return c_;
}

struct Source {
  json v;
  std::string path;
};

void check_keys(const std::string& file, const json& obj, const std::string& base,
                const std::vector<std::string>& known) {
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!contains(known, it.key())) bad(file, base + "/" + it.key(), unknown_key_msg(it.key(), known));
}

Scenario expand(const json& doc, const std::string& file, const std::vector<AxisOverride>& ovr) {
  if (!doc.is_object())
    bad(file, "/", "expected an object {schema, name, cases}" + got(doc));
  check_keys(file, doc, "", kTopKeys);
  if (!doc.contains("schema"))
    bad(file, "/schema", std::string("missing required field (expected \"") + kSchema + "\")");
  {
    const json& s = doc["schema"];
    if (!s.is_string()) bad(file, "/schema", std::string("expected \"") + kSchema + "\"" + got(s));
    std::string v = s.get<std::string>();
    const std::string major = kSchema;
    bool ok = v == major;
    if (!ok && v.rfind(major + ".", 0) == 0) {  // minor versions are additions: accepted
      std::string minor = v.substr(major.size() + 1);
      ok = !minor.empty() && minor.find_first_not_of("0123456789") == std::string::npos;
    }
    if (!ok)
      bad(file, "/schema",
          "unsupported schema " + show(s) + " (expected \"" + kSchema + "\")");
  }
  Scenario sc;
  sc.path = file;
  if (!doc.contains("name")) bad(file, "/name", "missing required field (expected a string)");
  sc.name = want_string(file, "/name", doc["name"]);
  if (sc.name.empty()) bad(file, "/name", "expected a non-empty string");
  if (doc.contains("description")) sc.description = want_string(file, "/description", doc["description"]);

  std::map<std::string, Source> defaults;
  if (doc.contains("defaults")) {
    const json& d = doc["defaults"];
    if (!d.is_object()) bad(file, "/defaults", "expected an object of case fields" + got(d));
    check_keys(file, d, "/defaults", all_fields());
    for (auto it = d.begin(); it != d.end(); ++it)
      if (!it.value().is_null()) defaults[it.key()] = {it.value(), "/defaults/" + it.key()};
  }
  for (const auto& o : ovr) {
    if (!contains(all_fields(), o.key) || o.key == "name")
      bad(file, "-a " + o.key, unknown_key_msg(o.key, all_fields()));
    if (o.value.is_null())
      defaults.erase(o.key);
    else
      defaults[o.key] = {o.value, "-a " + o.key};
  }
  if (!doc.contains("cases")) bad(file, "/cases", "missing required field (expected a non-empty list of cases)");
  const json& cases = doc["cases"];
  if (!cases.is_array()) bad(file, "/cases", "expected a non-empty list of cases" + got(cases));
  if (cases.empty()) bad(file, "/cases", "expected a non-empty list of cases, got []");

  std::vector<std::string> case_keys = all_fields();
  case_keys.push_back("description");
  std::map<std::string, std::string> seen;  // id -> case path
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const std::string cpath = "/cases/" + std::to_string(ci);
    const json& cj = cases[ci];
    if (!cj.is_object()) bad(file, cpath, "expected an object (a case)" + got(cj));
    check_keys(file, cj, cpath, case_keys);
    if (cj.contains("description")) want_string(file, cpath + "/description", cj["description"]);
    std::map<std::string, Source> merged = defaults;
    for (auto it = cj.begin(); it != cj.end(); ++it) {
      if (it.key() == "description") continue;
      bool overridden = false;
      for (const auto& o : ovr) overridden |= o.key == it.key();
      if (overridden) continue;
      if (it.value().is_null())
        merged.erase(it.key());  // null = not given: falls back to the field's rule
      else
        merged[it.key()] = {it.value(), cpath + "/" + it.key()};
    }
    if (!merged.count("name")) bad(file, cpath + "/name", "missing required field (expected a string)");
    if (!merged.count("op"))
      bad(file, cpath + "/op", "missing required field (expected one of " + join(registered_ops(), "|") + ")");

    // Axes in canonical order with their alternatives.
    std::vector<std::pair<std::string, std::vector<Alt>>> axes;
    size_t total = 1;
    for (const auto& k : all_fields()) {
      auto it = merged.find(k);
      if (it == merged.end()) continue;
      axes.emplace_back(k, alternatives(file, k, {it->second.v, it->second.path}));
      total *= axes.back().second.size();
      if (total > 1000000) bad(file, cpath, "expected at most 1000000 crossed cases per entry");
    }
    std::vector<size_t> idx(axes.size(), 0);
    for (size_t n = 0; n < total; ++n) {
      std::map<std::string, CaseBuilder::Pick> picks;
      for (size_t a = 0; a < axes.size(); ++a)
        picks[axes[a].first] = {axes[a].second[idx[a]], axes[a].second.size() > 1};
      Case c = CaseBuilder(file, cpath, std::move(picks)).build();
      auto [pos, fresh] = seen.emplace(c.id, cpath);
      if (!fresh)
        bad(file, cpath, "duplicate case id \"" + c.id + "\" (also from " + pos->second +
                             "; give the cases different names)");
      sc.cases.push_back(std::move(c));
      // Odometer: the last canonical field varies fastest.
      for (size_t a = axes.size(); a-- > 0;) {
        if (++idx[a] < axes[a].second.size()) break;
        idx[a] = 0;
      }
    }
  }
  return sc;
}

json parse_text(const std::string& text, const std::string& file) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    bad(file, "/", "expected a JSON object {schema, name, cases}, got an empty file");
  size_t ctrl = 0;
  for (unsigned char ch : text) {
    if (ch == 0) bad(file, "/", "expected JSON text, got binary data (NUL byte)");
    if (ch < 0x20 && ch != '\n' && ch != '\r' && ch != '\t') ++ctrl;
  }
  if (ctrl * 20 > text.size()) bad(file, "/", "expected JSON text, got binary data");
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    std::string w = e.what();
    auto p = w.find("] ");
    if (p != std::string::npos) w = w.substr(p + 2);
    for (char& ch : w)
      if (ch == '\n' || ch == '\r') ch = ' ';
    bad(file, "/", "expected valid JSON (" + w + ")");
  }
}

// The built-in default: every op whose entry asks to be in it, a decode step and a prefill.
std::string make_default_text() {
  std::string ops;
  for (const OpSpec* o : registered_op_specs())
    if (o->in_default_scenario) ops += std::string(ops.empty() ? "" : ", ") + "\"" + o->name + "\"";
  return R"json({
  "schema": "punica-bench.scenario/1",
  "name": "default",
  "description": "Built-in default: every single-device op, a decode step of 16 requests and a prefill of 4 x 32 tokens; 4 adapters of ranks 8/16/32 in 6 slots, a quarter of the requests without LoRA, bf16.",
  "defaults": {
    "hidden": 512, "slices": [512, 128, 128], "vocab": 1024, "out_features": 8,
    "max_loras": 6, "num_adapters": 4, "ranks": [8, 16, 32],
    "popularity": "uniform", "no_lora_fraction": 0.25, "scale": 0.5,
    "dtype": "bf16", "seed": 0, "warmup": 3, "iters": 10
  },
  "cases": [
    {"name": "decode", "op": [)json" + ops + R"json(],
     "phase": "decode", "num_requests": 16, "tokens_per_request": 1},
    {"name": "prefill", "op": [)json" + ops + R"json(],
     "phase": "prefill", "num_requests": 4, "tokens_per_request": 32}
  ]
}
)json";
}

// Uniform double in [0, 1) from a key and an index (53 bits).
double hash_unit(uint64_t key, uint64_t index) {
  return double(splitmix64(key ^ (index * 0xd1b54a32d192ed03ull + 0x2545f4914f6cdd1dull)) >> 11) *
         (1.0 / 9007199254740992.0);
}

}  // namespace

const std::vector<std::string>& known_models() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& m : kModels) v.push_back(m.name);
    return v;
  }();
  return names;
}
const std::vector<std::string>& scenario_fields() { return all_fields(); }
const ModelPreset* find_model(const std::string& name) {
  for (const auto& m : kModels)
    if (m.name == name) return &m;
  return nullptr;
}
std::string popularity_name(const Popularity& p) {
  if (p.kind == "zipf" && p.zipf_alpha != 1.0) return "zipf:" + fmt_double(p.zipf_alpha);
  return p.kind;
}

AxisOverride parse_axis_override(const std::string& text) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(ErrorKind::usage, "-a " + text + ": expected key=value (e.g. -a tp=[1,2])");
  AxisOverride o;
  o.key = text.substr(0, eq);
  std::string val = text.substr(eq + 1);
  if (!contains(all_fields(), o.key) || o.key == "name")
    throw Error(ErrorKind::usage, "-a " + o.key + ": " + unknown_key_msg(o.key, all_fields()));
  long long a = 0, b = 0, s = 0;
  char tail = 0;
  if (std::sscanf(val.c_str(), "[%lld:%lld:%lld]%c", &a, &b, &s, &tail) == 3) {
    if (s <= 0 || b < a || (b - a) / s > 100000)
      throw Error(ErrorKind::usage, "-a " + o.key + ": expected a range [start:end:step] with step > 0 and end >= start");
    o.value = json::array();
    for (long long x = a; x <= b; x += s) o.value.push_back(x);
    return o;
  }
  auto word = [](const std::string& w) {
    try {
      return json::parse(w);
    } catch (const json::parse_error&) {
      return json(w);  // a bare word: dtype=fp16, popularity=zipf
    }
  };
  o.value = word(val);
  if (o.value.is_string() && val.size() >= 2 && val.front() == '[' && val.back() == ']') {
    o.value = json::array();  // [fp16,bf16]: a list of bare words
    std::stringstream items(val.substr(1, val.size() - 2));
    for (std::string item; std::getline(items, item, ',');) {
      item.erase(0, item.find_first_not_of(' '));
      item.erase(item.find_last_not_of(' ') + 1);
      o.value.push_back(word(item));
    }
  }
  return o;
}

Scenario parse_scenario(const std::string& text, const std::string& path,
                        const std::vector<AxisOverride>& overrides) {
  return expand(parse_text(text, path), path, overrides);
}
Scenario parse_scenario(const std::string& text, const std::string& path) {
  return parse_scenario(text, path, {});
}
Scenario load_scenario(const std::string& path, const std::vector<AxisOverride>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "/", "cannot open scenario file (expected a readable JSON file)");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) bad(path, "/", "cannot read scenario file");
  return parse_scenario(ss.str(), path, overrides);
}
Scenario load_scenario(const std::string& path) { return load_scenario(path, {}); }

const std::string& default_scenario_text() {
  static const std::string t = make_default_text();
  return t;
}
Scenario default_scenario(const std::vector<AxisOverride>& overrides) {
  return parse_scenario(default_scenario_text(), "<built-in default>", overrides);
}
Scenario default_scenario() { return default_scenario({}); }

BatchLayout make_layout(const Case& c) {
  BatchLayout out;
  const int L = std::max(c.max_loras, 0);
  const int n = std::min(std::max(c.num_adapters, 0), L);
  const int64_t R = std::max<int64_t>(c.num_requests, 0);
  const uint64_t ch = hash_string(c.id);
  const uint64_t k_slots = hash_key(c.seed, ch, hash_string("layout/slots"));
  const uint64_t k_none = hash_key(c.seed, ch, hash_string("layout/no_lora"));
  const uint64_t k_pop = hash_key(c.seed, ch, hash_string("layout/popularity"));

  // Slots: a hashed permutation of [0, L); adapter a sits in perm[a]. Adapter 0 (the first under
  // round_robin/sorted, the most popular under zipf) always takes the last slot, which vLLM's own
  // kernel tests never exercise.
  std::vector<int32_t> perm(static_cast<size_t>(L));
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = L - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[hash_below(k_slots, uint64_t(i), uint64_t(i) + 1)]);
  if (L > 0) std::swap(perm[0], *std::find(perm.begin(), perm.end(), L - 1));
  out.slot_rank.assign(size_t(L), 0);
  out.adapter_slot.resize(size_t(n));
  for (int a = 0; a < n; ++a) {
    out.adapter_slot[size_t(a)] = perm[size_t(a)];
    out.slot_rank[size_t(perm[size_t(a)])] =
        c.ranks.empty() ? 0 : c.ranks[size_t(a) % c.ranks.size()];
  }

  // Requests without LoRA: exactly round(f * R) of them (hash-chosen; the first ones for sorted).
  out.request_slot.assign(size_t(R), -1);
  std::vector<char> none(size_t(R), 0);
  int64_t k = n == 0 ? R : std::llround(c.no_lora_fraction * double(R));
  k = std::clamp<int64_t>(k, 0, R);
  const std::string& kind = c.popularity.kind;
  if (kind == "sorted" || k == R) {
    for (int64_t q = 0; q < k; ++q) none[size_t(q)] = 1;
  } else if (k > 0) {
    std::vector<std::pair<uint64_t, int64_t>> order(static_cast<size_t>(R));
    for (int64_t q = 0; q < R; ++q) order[size_t(q)] = {splitmix64(k_none ^ splitmix64(uint64_t(q))), q};
    std::nth_element(order.begin(), order.begin() + k, order.end());
    for (int64_t i = 0; i < k; ++i) none[size_t(order[size_t(i)].second)] = 1;
  }

  std::vector<double> cdf;
  if (kind == "zipf" && n > 0) {
    double acc = 0;
    for (int a = 0; a < n; ++a) cdf.push_back(acc += std::pow(double(a + 1), -c.popularity.zipf_alpha));
  }
  const int64_t M = R - k;  // requests with an adapter
  int64_t j = 0;            // index among them
  for (int64_t q = 0; q < R; ++q) {
    if (none[size_t(q)]) continue;
    int a = 0;
    if (kind == "round_robin") {
      a = int(j % n);
    } else if (kind == "sorted") {
      a = int((j * n) / M);  // contiguous, equal (±1) chunks in adapter order
    } else if (kind == "zipf") {
      double u = hash_unit(k_pop, uint64_t(q)) * cdf.back();
      a = int(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      a = std::min(a, n - 1);
    } else {
      a = int(hash_below(k_pop, uint64_t(q), uint64_t(n)));
    }
    out.request_slot[size_t(q)] = out.adapter_slot[size_t(a)];
    ++j;
  }
  const int64_t tpr = std::max<int64_t>(c.tokens_per_request, 1);
  out.token_slot.reserve(size_t(R * tpr));
  for (int64_t q = 0; q < R; ++q) out.token_slot.insert(out.token_slot.end(), size_t(tpr), out.request_slot[size_t(q)]);
  std::set<int32_t> active;
  for (int32_t s : out.request_slot)
    if (s >= 0 && tpr > 0) active.insert(s);
  out.num_active_adapters = int(active.size());
  return out;
}

}  // namespace punica::bench
