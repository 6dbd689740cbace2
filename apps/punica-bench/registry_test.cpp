// Registry tests: the shipped entries are complete and ordered, and an op added by one entry alone
// (a test op registered below, with a field of its own) reaches the scenario parser, the case ids,
// the validation messages, the generated schema and make_problem, with no other file touched.
#include "apps/punica-bench/registry.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "apps/punica-bench/problem.h"
#include "apps/punica-bench/schema.h"
#include "apps/punica-bench/scenario.h"
#include "kernels/common/error.h"

namespace punica::bench {
namespace {

// A do-nothing problem: enough to prove the entry's make() is what the registry calls.
class WidgetProblem final : public Problem {
 public:
  explicit WidgetProblem(int64_t widgets) : widgets_(widgets) {}
  void run(Backend&, const std::vector<void*>&) override {}
  void reference(const std::vector<void*>&, bool) override {}
  Work work() const override {
    Work w;
    w.bytes = double(widgets_);
    return w;
  }

 private:
  int64_t widgets_;
};

OpSpec widget_spec() {
  OpSpec s;
  s.name = "test_widget_op";
  s.order = 500;
  s.summary = "registry test op";
  s.exclusive_fields = {"widgets"};
  FieldSpec f;
  f.name = "widgets";
  f.order = 215;  // between num_adapters (180) ... ranks (200) and max_rank (210) / popularity (220)
  f.value_schema = {{"type", "integer"}, {"minimum", 1}, {"maximum", 9}};
  f.description = "How many widgets.";
  s.fields = {f};
  s.require = [](CaseContext& x) {
    if (!x.has("widgets")) x.missing("widgets");
  };
  s.applicable = [](CaseContext& x) {
    if (x.i64("widgets", 0) == 7) x.skip("seven widgets are unlucky");
  };
  s.make = [](const Case& c, const BatchLayout&, const ProblemOptions&) {
    return std::make_unique<WidgetProblem>(c.params.value("widgets", int64_t(0)));
  };
  return s;
}
const RegisterOp kWidget{widget_spec()};

std::string doc(const std::string& cases) {
  return R"({"schema": "punica-bench.scenario/1", "name": "t", "defaults": {"max_loras": 2, "num_requests": 3},
             "cases": )" + cases + "}";
}

std::string usage_error(const std::string& text) {
  try {
    parse_scenario(text, "mem.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage);
    return e.what();
  }
  return "";
}

TEST(Registry, ShippedOpsAreCompleteAndOrdered) {
  std::vector<std::string> ops = registered_ops();
  for (const char* want : {"lora_meta", "lora_shrink", "lora_expand", "add_lora_linear", "add_lora_embedding",
                           "add_lora_logits", "apply_lora_full_linear", "layer"})
    EXPECT_NE(std::find(ops.begin(), ops.end(), want), ops.end()) << want;
  EXPECT_EQ(ops.front(), "lora_meta");
  EXPECT_EQ(ops.back(), "layer");
  std::set<int> orders;
  for (const OpSpec* s : registered_op_specs()) {
    EXPECT_TRUE(orders.insert(s->order).second) << s->name << ": order taken twice";
    EXPECT_FALSE(s->summary.empty()) << s->name;
    EXPECT_TRUE(bool(s->make)) << s->name;
  }
  EXPECT_THROW(RegisterOp{widget_spec()}, Error);  // a name registers once
}

TEST(Registry, AnEntryAloneAddsAnOpWithItsField) {
  Scenario s = parse_scenario(doc(R"([{"name": "w", "op": "test_widget_op", "widgets": [2, 7]}])"), "mem.json");
  ASSERT_EQ(s.cases.size(), 2u);
  // The field sits in the id at its registered place in the canonical order.
  EXPECT_EQ(s.cases[0].id, "w/test_widget_op/num_requests=3/max_loras=2/widgets=2");
  EXPECT_TRUE(s.cases[0].skip_reason.empty());
  EXPECT_EQ(s.cases[1].skip_reason, "seven widgets are unlucky");
  // The entry's make() builds the problem.
  EXPECT_EQ(s.cases[0].params.value("widgets", 0), 2);
  EXPECT_EQ(make_problem(s.cases[0])->work().bytes, 2.0);
  // Its schema, its requirement, and its exclusivity are enforced with the file and path.
  EXPECT_NE(usage_error(doc(R"([{"name": "w", "op": "test_widget_op", "widgets": 10}])"))
                .find("mem.json: /cases/0/widgets: expected a positive integer <= 9, got integer 10"),
            std::string::npos)
      << usage_error(doc(R"([{"name": "w", "op": "test_widget_op", "widgets": 10}])"));
  EXPECT_NE(usage_error(doc(R"([{"name": "w", "op": "test_widget_op"}])")).find("missing required field widgets"),
            std::string::npos);
  EXPECT_NE(usage_error(doc(R"([{"name": "w", "op": "lora_meta", "widgets": 2}])"))
                .find("mem.json: /cases/0/widgets: expected widgets only with op test_widget_op, got op lora_meta"),
            std::string::npos);
  // The generated schema carries the op and the field.
  const std::string schema = scenario_schema_text();
  EXPECT_NE(schema.find("\"test_widget_op\""), std::string::npos);
  EXPECT_NE(schema.find("\"widgets\""), std::string::npos);
}

TEST(Registry, SharedExclusiveFieldNamesItsOwners) {
  const std::string msg =
      usage_error(doc(R"([{"name": "m", "op": "lora_meta", "active_loras_hint": true}])"));
  EXPECT_NE(msg.find("expected active_loras_hint only with op lora_shrink, lora_expand or add_lora_linear, got op "
                     "lora_meta"),
            std::string::npos)
      << msg;
  // false is the default: allowed on any op
  EXPECT_EQ(usage_error(doc(R"([{"name": "m", "op": "lora_meta", "active_loras_hint": false}])")), "");
}

}  // namespace
}  // namespace punica::bench
