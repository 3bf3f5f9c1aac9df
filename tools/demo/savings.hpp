#pragma once
// What each technique should save at the peak, from first-principles byte counts of the demo
// model (its activations are fp32, its parameters padded as in model.hpp). The test checks the
// measured peaks against these; the table prints them beside the measurement.
#include <cstdint>
#include <string>

#include "tools/demo/configurations.hpp"
#include "tools/demo/run.hpp"

namespace stowage::demo {

struct Saving {
  std::int64_t bytes = 0;   // predicted drop of the peak allocated bytes
  std::int64_t blocks = 0;  // allocator blocks the technique adds or removes at the peak
  std::string formula;      // how bytes was computed, for messages
};

// `params`: parameter elements as laid out (ParameterLayout::total).
Saving predicted_saving(const Techniques& t, const DemoOptions& options, std::int64_t params);

}  // namespace stowage::demo
