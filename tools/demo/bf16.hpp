#pragma once
// bf16 <-> fp32 as mixed-precision training does it: round-to-nearest-even on the way down,
// exact on the way up.
#include <bit>
#include <cstdint>

namespace stowage::demo {

inline std::uint16_t to_bf16_rne(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

inline float from_bf16(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

}  // namespace stowage::demo
