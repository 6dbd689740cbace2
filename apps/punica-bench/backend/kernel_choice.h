// `--kernel OP=KIND` (check and run): a fixed kernel for the standalone lora_shrink / lora_expand
// ops instead of the automatic choice, so that kernel kinds can be ranked under the bench's own
// checking and timing (rotated inputs, cold and back to back, the floor) rather than in the perf
// tests, whose graphs repeat one set of inputs (results/NOTES.md v34 part 1: there the two rankings
// differed). add_lora_linear and the layers keep their own paths. The names are those of
// kernels::ShrinkKernel and ExpandPrefillKernel (kernels::kind_name); a kind that
// cannot take a shape falls back as launch_lora_shrink_with / launch_lora_expand_with document (an explicit expand kind also runs
// at decode sizes, where the automatic choice takes the decode kernels). A named kind runs in its
// general configuration: the automatic choice also picks small-batch tile heights (the expand's 16-
// and 32-row tiles), so `auto` can beat every named kind (NOTES v34 part 4: expand=stream at T=16 is
// the 64-row streaming kernel, 1.4-1.75x automatic's time back to back).
#pragma once
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "kernels/lora_expand/lora_expand.h"
#include "kernels/lora_shrink/lora_shrink.h"

namespace punica::bench {

struct KernelChoice {
  kernels::ShrinkKernel shrink = kernels::ShrinkKernel::automatic;
  kernels::ExpandPrefillKernel expand = kernels::ExpandPrefillKernel::automatic;
  bool any() const {
    return shrink != kernels::ShrinkKernel::automatic || expand != kernels::ExpandPrefillKernel::automatic;
  }
  // {"lora_shrink": name, "lora_expand": name} (the result JSON's run.options.kernels)
  nlohmann::json to_json() const;
};

// Every name `--kernel shrink=` / `expand=` accepts, "auto" first.
const std::vector<std::string>& shrink_kernel_names();
const std::vector<std::string>& expand_kernel_names();
// "shrink: auto, legacy, ...; expand: auto, staged, stream, pipe" (`--help`)
std::string kernel_kinds_text();
std::string shrink_kernel_name(kernels::ShrinkKernel k);
std::string expand_kernel_name(kernels::ExpandPrefillKernel k);

// Parses "shrink=KIND" / "expand=KIND" (each op at most once); a bad spec throws a usage Error that
// names the spec and the values expected.
KernelChoice parse_kernel_choice(const std::vector<std::string>& specs);

// A result file's run.options.kernels, automatic for both ops where the file has none (files from
// before `--kernel`), and whether it names a fixed kernel (compare and targets say so).
nlohmann::json result_kernels(const nlohmann::json& result);
bool result_times_fixed_kernels(const nlohmann::json& result);

}  // namespace punica::bench
