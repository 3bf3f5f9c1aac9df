#pragma once
// What `stowage plan` prints: the top plans with memory and time breakdowns, why the best beats
// the runner-up, the Megatron-LM arguments that run it, JSON (schema stowage.plan/1) and an SVG.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/plan/search.hpp"

namespace stowage::plan {

// Megatron-LM (and MindSpeed, for stowage's techniques) launch arguments for a plan.
std::string megatron_arguments(const estimate::RunConfig& c);
// What of the model those arguments cannot say (Megatron-LM has no argument for it), one phrase
// each: the line then builds a model that differs from the one planned in these, and only these.
std::vector<std::string> megatron_cannot_say(const estimate::ModelConfig& m);
// One sentence per component where the best plan gains most over the runner-up.
std::string why_best(const Plan& best, const Plan& runner_up);
std::string to_table(const PlanRequest& request, const SearchResult& result);
nlohmann::json to_json(const PlanRequest& request, const SearchResult& result);
// Stacked bars of each top plan's step time by component.
std::string to_svg(const PlanRequest& request, const SearchResult& result);

}  // namespace stowage::plan
