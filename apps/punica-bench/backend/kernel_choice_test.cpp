// --kernel OP=KIND parsing (host only): every accepted name maps to its own kernel and back, bad
// specs fail with a usage error that names what was expected.
#include <gtest/gtest.h>
#include <set>
#include "apps/punica-bench/backend/kernel_choice.h"
#include "kernels/common/error.h"

namespace punica::bench {
namespace {

using SK = kernels::ShrinkKernel;
using EK = kernels::ExpandPrefillKernel;

TEST(KernelChoice, DefaultIsAutomatic) {
  const KernelChoice c = parse_kernel_choice({});
  EXPECT_FALSE(c.any());
  EXPECT_EQ(c.to_json(), nlohmann::json({{"lora_shrink", "auto"}, {"lora_expand", "auto"}}));
}

TEST(KernelChoice, EveryNameRoundTrips) {
  std::set<int> kinds;
  for (const std::string& n : shrink_kernel_names()) {
    const KernelChoice c = parse_kernel_choice({"shrink=" + n});
    EXPECT_EQ(shrink_kernel_name(c.shrink), n);
    EXPECT_EQ(c.any(), n != "auto") << n;
    EXPECT_TRUE(kinds.insert(int(c.shrink)).second) << n << " maps to a kernel another name has";
  }
  EXPECT_EQ(kinds.size(), std::size_t(int(SK::small_cluster) + 1));  // every ShrinkKernel has a name
  kinds.clear();
  for (const std::string& n : expand_kernel_names()) {
    const KernelChoice c = parse_kernel_choice({"expand=" + n});
    EXPECT_EQ(expand_kernel_name(c.expand), n);
    EXPECT_TRUE(kinds.insert(int(c.expand)).second) << n;
  }
  EXPECT_EQ(kinds.size(), std::size_t(4));
  const KernelChoice both = parse_kernel_choice({"expand=pipe", "shrink=fused_wk"});
  EXPECT_EQ(both.shrink, SK::fused_wk);
  EXPECT_EQ(both.expand, EK::mma_pipe);
  EXPECT_EQ(both.to_json(), nlohmann::json({{"lora_shrink", "fused_wk"}, {"lora_expand", "pipe"}}));
}

TEST(KernelChoice, ResultFiles) {
  nlohmann::json old = {{"run", {{"options", {{"iters", 30}}}}}};  // before --kernel: automatic
  EXPECT_EQ(result_kernels(old), KernelChoice{}.to_json());
  EXPECT_FALSE(result_times_fixed_kernels(old));
  EXPECT_FALSE(result_times_fixed_kernels(nlohmann::json::object()));
  nlohmann::json forced = old;
  forced["run"]["options"]["kernels"] = parse_kernel_choice({"expand=stream"}).to_json();
  EXPECT_TRUE(result_times_fixed_kernels(forced));
  EXPECT_EQ(result_kernels(forced)["lora_expand"], "stream");
  forced["run"]["options"]["kernels"] = KernelChoice{}.to_json();
  EXPECT_FALSE(result_times_fixed_kernels(forced));
  EXPECT_EQ(kernel_kinds_text().rfind("shrink: auto, legacy, fused, ", 0), 0u) << kernel_kinds_text();
  EXPECT_NE(kernel_kinds_text().find("; expand: auto, staged, stream, pipe"), std::string::npos) << kernel_kinds_text();
}

void expect_usage(const std::vector<std::string>& specs, const std::string& needle) {
  try {
    parse_kernel_choice(specs);
    ADD_FAILURE() << "accepted " << specs.front();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(KernelChoice, BadSpecs) {
  expect_usage({"shrink=fused_xx"}, "unknown shrink kernel 'fused_xx' (expected one of auto, legacy, fused,");
  expect_usage({"expand=mma_pipe"}, "unknown expand kernel 'mma_pipe' (expected one of auto, staged, stream, pipe)");
  expect_usage({"shrink"}, "unknown shrink kernel ''");
  expect_usage({"linear=pipe"}, "expected shrink=KIND or expand=KIND");
  expect_usage({"shrink=fused", "shrink=fused_sk"}, "shrink is given twice");
  expect_usage({"expand=pipe", "expand=pipe"}, "expand is given twice");
}

}  // namespace
}  // namespace punica::bench
