// The op registry (DESIGN §2): every PunicaWrapper op and the "layer" op is one self-registering
// OpSpec that owns its scenario fields and their validation, turns a Case into a Problem, runs its
// kernel or its reference on a Backend, and names its `--kernel` kinds. The scenario parser, the
// runner, `info`, `schema` and the microbenchmarks read the ops only through this registry.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace punica::bench {

struct Case;
struct BatchLayout;
struct ProblemOptions;
class Problem;

// A scenario field: its JSON schema for one value and a description (the generated schema and
// `validate`'s type checks read it). `order` places it in the canonical field order (the order in
// which lists cross and declared axes appear in case ids); the shared fields use multiples of 10.
struct FieldSpec {
  std::string name;
  int order = 0;
  nlohmann::json value_schema;  // JSON schema of ONE value (a list of these crosses)
  std::string description;
  bool list_valued = false;      // one value is itself a list: crosses only as a list of lists
};

// What an op's hooks may do while the scenario parser builds one case: read the case's fields,
// and report a missing field, an invalid value (exit 2), or a skip (a crossing-made combination).
class CaseContext {
 public:
  virtual ~CaseContext() = default;
  virtual Case& c() = 0;
  virtual bool has(const std::string& key) const = 0;
  virtual int64_t i64(const std::string& key, int64_t def) const = 0;
  virtual const nlohmann::json& value(const std::string& key) const = 0;
  [[noreturn]] virtual void missing(const std::string& what) = 0;
  virtual void problem(const std::string& what, const std::vector<std::string>& keys) = 0;
  virtual void skip(const std::string& why) = 0;
  virtual std::string id_value(const std::string& key, const nlohmann::json& v) const = 0;
};

struct OpSpec {
  std::string name;
  int order = 0;                // position in listings (info, schema enum, default scenario)
  std::string summary;          // one line (info, schema)
  bool in_default_scenario = false;
  bool multi_rank = false;      // tp > 1 and fully_sharded apply (the layers)
  // Fields only this op (or the ops that list them too) may set; any other op given one is an error
  // naming the ops that take it. The field's spec is registered once (by any of its owners).
  std::vector<std::string> exclusive_fields;
  std::vector<FieldSpec> fields;  // fields this op introduces (beyond the shared ones)
  // Scenario hooks, each optional. `defaults`: before the slices are resolved (hidden, vocab and
  // the heads are); sets op-owned defaults and returns the slices used when the case gives neither
  // slices, num_slices nor a module. `require`: the sizes the op needs (missing() / problem()).
  // `applicable`: whether the case's module fits the op, and other combination rules (skip()).
  std::function<std::vector<int64_t>(CaseContext&)> defaults;
  std::function<void(CaseContext&)> require;
  std::function<void(CaseContext&)> applicable;
  // Case -> problem (tensors deterministic from seed and case id).
  std::function<std::unique_ptr<Problem>(const Case&, const BatchLayout&, const ProblemOptions&)> make;
  // Bytes of the case's tensors (inputs, outputs, workspaces), for the size check before any case
  // runs; unset = the generic estimate of case_bytes_needed.
  std::function<double(const Case&)> bytes_needed;
  // `--kernel` kinds this op takes ("auto" first; empty = none), for `info`.
  std::function<std::vector<std::string>()> kernel_kinds;
  // The kernel plan a case runs (recorded in its result); empty = the op has one path.
  std::function<std::string(const Problem&)> plan;
};

// Registers at static-initialisation time: `static RegisterOp reg{OpSpec{...}};` in the op's entry.
struct RegisterOp {
  explicit RegisterOp(OpSpec spec);
};

const OpSpec* find_op(const std::string& name);  // nullptr when unknown
std::vector<const OpSpec*> registered_op_specs();  // by order
std::vector<std::string> registered_ops();          // names, by order
bool is_registered_op(const std::string& op);
// Every op-introduced field, by order.
std::vector<FieldSpec> registered_op_fields();
// The ops that list `field` among their exclusive fields (empty: any op may set it).
std::vector<std::string> field_owners(const std::string& field);
// An estimate (from above) of the bytes one copy of the case's tensors takes: the entry's own, or a
// generic one from the shared fields (x, stacked A and B, y with guard columns, the intermediate,
// for layers the base weights).
double case_bytes_needed(const Case& c);

}  // namespace punica::bench
