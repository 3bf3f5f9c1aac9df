#include "tools/estimate/fit.hpp"

#include <algorithm>
#include <numeric>

#include "stowage/error.hpp"
#include "tools/estimate/comparison.hpp"

namespace stowage::estimate {

namespace {

// Largest k ≥ 1 (value k·step) whose peak fits; 0 when even k = 1 does not.
std::int64_t search(RunConfig c, std::int64_t budget, FitDim dim, std::int64_t step, std::int64_t max_k,
                    StageMemory& at) {
  auto fits = [&](std::int64_t k) {
    (dim == FitDim::micro_batch ? c.training.micro_batch : c.training.seq_length) = k * step;
    StageMemory m;
    try {
      m = estimate_memory(c);
    } catch (const InvalidArgument&) {
      return false;  // beyond what the model represents (2^62 bytes): does not fit
    }
    if (m.peak_reserved > budget) return false;
    at = m;
    return true;
  };
  if (max_k < 1 || !fits(1)) return 0;
  std::int64_t lo = 1, hi = 2;
  while (hi <= max_k && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, max_k + 1);
  while (hi - lo > 1) {  // fits(lo), !fits(hi) or hi beyond the range
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid;
  }
  fits(lo);
  return lo * step;
}

}  // namespace

FitResult fit(const RunConfig& config, std::int64_t budget, FitDim dim) {
  if (budget <= 0) throw InvalidArgument("fit: the device budget must be positive");
  FitResult r;
  r.dim = dim;
  r.budget = budget;
  const auto& p = config.parallel;
  r.step = dim == FitDim::micro_batch ? 1 : std::lcm<std::int64_t>(128, p.cp * (p.sequence_parallel ? p.tp : 1));
  std::int64_t max_k = dim == FitDim::micro_batch ? (std::int64_t{1} << 20) : (std::int64_t{1} << 24) / r.step;
  // A learned position table is the longest sequence the model takes.
  if (dim == FitDim::seq_length && config.model.learned_positions > 0 &&
      config.model.learned_positions / r.step < max_k) {
    max_k = config.model.learned_positions / r.step;
    r.limit_is_positions = true;
  }
  r.limit = max_k * r.step;
  RunConfig base = without_techniques(config);
  RunConfig all = with_all_techniques(config);
  if (dim == FitDim::micro_batch) base.training.global_batch = all.training.global_batch = 0;
  validate(base);  // reports configuration errors before searching
  r.without_stowage = search(base, budget, dim, r.step, max_k, r.memory_without);
  r.with_stowage = search(all, budget, dim, r.step, max_k, r.memory_with);
  return r;
}

}  // namespace stowage::estimate
