// The op registry (registry.h): entries register themselves at static initialisation; lookups sort
// by each entry's `order` so listings, the schema and the default scenario are stable.
#include "apps/punica-bench/registry.h"

#include <algorithm>
#include <set>

#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/scenario.h"
#include "kernels/common/dtype.h"
#include "kernels/common/error.h"

namespace punica::bench {
namespace {

std::vector<OpSpec>& table() {
  static std::vector<OpSpec> t;  // function-local: safe from any entry's static initialiser
  return t;
}

}  // namespace

RegisterOp::RegisterOp(OpSpec spec) {
  PUNICA_REQUIRE(!spec.name.empty() && spec.make, ErrorKind::runtime, "registry: an op entry needs a name and make");
  PUNICA_REQUIRE(find_op(spec.name) == nullptr, ErrorKind::runtime, "registry: op '" + spec.name + "' registered twice");
  table().push_back(std::move(spec));
}

const OpSpec* find_op(const std::string& name) {
  for (const auto& s : table())
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<const OpSpec*> registered_op_specs() {
  std::vector<const OpSpec*> v;
  for (const auto& s : table()) v.push_back(&s);
  std::stable_sort(v.begin(), v.end(), [](const OpSpec* a, const OpSpec* b) { return a->order < b->order; });
  return v;
}

std::vector<std::string> registered_ops() {
  std::vector<std::string> v;
  for (const OpSpec* s : registered_op_specs()) v.push_back(s->name);
  return v;
}

bool is_registered_op(const std::string& op) { return find_op(op) != nullptr; }

std::vector<FieldSpec> registered_op_fields() {
  std::vector<FieldSpec> v;
  std::set<std::string> seen;
  for (const OpSpec* s : registered_op_specs())
    for (const auto& f : s->fields)
      if (seen.insert(f.name).second) v.push_back(f);
  std::stable_sort(v.begin(), v.end(), [](const FieldSpec& a, const FieldSpec& b) { return a.order < b.order; });
  return v;
}

std::vector<std::string> field_owners(const std::string& field) {
  std::vector<std::string> v;
  for (const OpSpec* s : registered_op_specs())
    if (std::find(s->exclusive_fields.begin(), s->exclusive_fields.end(), field) != s->exclusive_fields.end())
      v.push_back(s->name);
  return v;
}

double case_bytes_needed(const Case& c) {
  const OpSpec* s = find_op(c.op);
  if (s != nullptr && s->bytes_needed) return s->bytes_needed(c);
  const double es = double(kernels::dtype_size(c.dtype)), T = double(c.num_tokens), H = double(c.hidden);
  const double L = double(c.max_loras), r = double(c.max_rank), S = double(std::max<std::size_t>(1, c.slices.size()));
  double N = 0;
  for (auto n : c.slices) N += double(n);
  const double V = double(c.vocab), O = double(c.out_features);
  double b = es * (T * H + S * L * r * H + L * N * r + T * (N + 64 * S));  // x, A, B, y (+ guards)
  b += 4.0 * S * T * r + 64.0 * (T + L + 8);                                // intermediate, metadata
  b += es * (L * (V + H) * r + T * (V + H));                                // embedding / logits tables
  b += es * L * O * (H + 1) + es * T * O;                                   // full-linear heads
  if (!c.layer.empty()) b += es * (N * H + V * H);                          // the base weights
  return b;
}

std::unique_ptr<Problem> make_problem(const Case& c, const ProblemOptions& o) {
  const OpSpec* s = find_op(c.op);
  PUNICA_REQUIRE(s != nullptr, ErrorKind::usage, "op '" + c.op + "' has no registered problem");
  BatchLayout lay = make_layout(c);
  return s->make(c, lay, o);
}

}  // namespace punica::bench
