#pragma once
// The estimate as an SVG stacked-bar chart: one bar per configuration (no stowage, each
// technique alone, all together, as configured), segments by kind of memory.
#include <string>

#include "tools/estimate/comparison.hpp"

namespace stowage::estimate {

std::string to_svg(const EstimateResult& r);

}  // namespace stowage::estimate
