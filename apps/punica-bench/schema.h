// `punica-bench schema`: the scenario JSON schema generated from the registry (schema.cpp).
#pragma once
#include <string>

namespace punica::bench {

// The text of scenarios/schema/scenario.schema.json (indent 1, trailing newline).
std::string scenario_schema_text();

}  // namespace punica::bench
