#pragma once
// Shared set-up for the caching allocator tests: a small emulated device.
#include <memory>

#include "stowage/allocator.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"

namespace stowage::test {

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;

inline std::unique_ptr<Device> small_device(std::size_t capacity = 256 * MiB) {
  EmulatedOptions o;
  o.capacity = capacity;
  return make_emulated_device(0, o);
}

inline AllocatorOptions classic_options() {
  AllocatorOptions o;
  o.segments = SegmentMode::classic;
  return o;
}

// For tests of where the pools place blocks: threads' caches keep freed blocks back from the
// pools (and from merging) until the pools need them, which changes placement, not totals.
inline AllocatorOptions without_thread_caches(AllocatorOptions o = {}) {
  o.thread_cache_bytes = 0;
  return o;
}

inline std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace stowage::test
