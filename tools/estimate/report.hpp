#pragma once
// The estimate as a readable table and as JSON (schema: docs/estimate.md, "schema": "stowage.estimate/1").
#include <nlohmann/json.hpp>

#include <string>

#include "tools/estimate/comparison.hpp"

namespace stowage::estimate {

std::string to_table(const EstimateResult& r);
nlohmann::json to_json(const EstimateResult& r);
nlohmann::json to_json(const StageMemory& m);

}  // namespace stowage::estimate
