#pragma once
// Argument checks shared by the precision entry points; each throws InvalidArgument before
// anything is written.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <fmt/format.h>

#include "stowage/error.hpp"
#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"

namespace stowage::detail {

inline void check_pointer(const void* p, std::size_t align, const char* what) {
  if (p == nullptr) throw InvalidArgument(fmt::format("{} is null", what));
  if (reinterpret_cast<std::uintptr_t>(p) % align != 0) {
    throw InvalidArgument(fmt::format("{} at {} is not {}-byte aligned", what, p, align));
  }
}

inline void check_range(std::size_t begin, std::size_t end, std::size_t numel, const char* what) {
  if (begin > end || end > numel) {
    throw InvalidArgument(fmt::format("{}: range [{}, {}) is outside the {} elements", what, begin, end, numel));
  }
}

inline void check_planes(const SplitPlanes& w, std::size_t begin, std::size_t end, const char* what) {
  check_range(begin, end, w.numel, what);
  if (w.rounding != Rounding::half_up && w.rounding != Rounding::nearest_even) {
    throw InvalidArgument(fmt::format("{}: unknown rounding mode {}", what, static_cast<int>(w.rounding)));
  }
  if (w.numel == 0) return;
  check_pointer(w.bf16, 2, "bf16 plane");
  check_pointer(w.residual, 2, "residual plane");
  if (w.rounding == Rounding::nearest_even) check_pointer(w.ties, 1, "tie bitmap (nearest_even)");
}

inline void check_scaling(const GradScaling& s, const char* what) {
  if (!(std::isfinite(s.loss_scale) && s.loss_scale > 0.0f)) {
    throw InvalidArgument(fmt::format("{}: loss_scale must be finite and > 0 (got {})", what, s.loss_scale));
  }
  if (!(std::isfinite(s.clip_coef) && s.clip_coef >= 0.0f)) {
    throw InvalidArgument(fmt::format("{}: clip_coef must be finite and >= 0 (got {})", what, s.clip_coef));
  }
}

}  // namespace stowage::detail
