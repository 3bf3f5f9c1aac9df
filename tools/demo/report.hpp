#pragma once
// The demo's output: the final table, JSON, and an SVG bar chart of peak device memory.
#include <string>
#include <vector>

#include "tools/demo/run.hpp"

namespace stowage::demo {

std::string format_table(const std::vector<ConfigResult>& results, const DemoOptions& options);
std::string to_json(const std::vector<ConfigResult>& results, const DemoOptions& options);
// Well-formed standalone SVG: per configuration, bars of peak allocated and peak reserved bytes.
std::string to_svg(const std::vector<ConfigResult>& results, const DemoOptions& options);

}  // namespace stowage::demo
