// Split / merge on the host: the portable kernels (SimdLevel::scalar: sixteen plain-C++ lanes, for
// CPUs without AVX2) and the checked public entry points.
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>
#if defined(__SSE2__)
#include <emmintrin.h>  // the portable path's non-temporal stores (x86-64 has SSE2)
#endif

#include "precision/kernel_table.hpp"
#include "precision/validate.hpp"
#include "stowage/error.hpp"
#include "stowage/precision.hpp"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

namespace stowage {
namespace detail {
namespace {
// The order matters: the kernel bodies use the ops structs declared before them.
// clang-format off
#include "precision/ops_scalar.hpp"
#include "precision/ops_lanes.hpp"
#include "precision/host_kernels.hpp"
// clang-format on
}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table = make_table<LanesOps>();
  return table;
}
}  // namespace detail

const char* to_string(Rounding r) {
  switch (r) {
    case Rounding::half_up: return "half_up";
    case Rounding::nearest_even: return "nearest_even";
  }
  return "?";
}

void split(const float* src, const SplitPlanes& dst, std::size_t begin, std::size_t end) {
  detail::check_planes(dst, begin, end, "split");
  if (end > begin) detail::check_pointer(src, alignof(float), "split: source");
  detail::kernels().split(src, dst, begin, end);
}

void merge(const SplitPlanes& src, float* dst, std::size_t begin, std::size_t end) {
  detail::check_planes(src, begin, end, "merge");
  if (end > begin) detail::check_pointer(dst, alignof(float), "merge: destination");
  detail::kernels().merge(src, dst, begin, end);
}

}  // namespace stowage
