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

inline std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace stowage::test
