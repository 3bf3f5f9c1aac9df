#pragma once
// The largest micro-batch (or sequence length) whose predicted peak reserved bytes fit a
// device, with and without stowage's techniques.
#include <cstdint>

#include "tools/estimate/memory_model.hpp"

namespace stowage::estimate {

enum class FitDim { micro_batch, seq_length };

struct FitResult {
  FitDim dim = FitDim::micro_batch;
  std::int64_t budget = 0;
  std::int64_t step = 1;             // sequence lengths are searched in multiples of this
  std::int64_t limit = 0;            // the largest value searched (a learned position table's rows, or a cap)
  bool limit_is_positions = false;   // the limit is the learned position table: nothing longer runs
  std::int64_t without_stowage = 0;  // 0: nothing fits
  std::int64_t with_stowage = 0;
  StageMemory memory_without, memory_with;  // at the values found (when > 0)
};

// Memory grows monotonically in both dimensions, so a doubling search then bisection finds the
// largest value. InvalidArgument for a non-positive budget.
FitResult fit(const RunConfig& config, std::int64_t budget, FitDim dim);

}  // namespace stowage::estimate
