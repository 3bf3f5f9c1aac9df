#pragma once
// bf16 <-> fp32 as mixed-precision training does it: round-to-nearest-even on the way down (a NaN
// stays a quiet NaN), exact on the way up. The one definition every kernel uses: on scalars or
// GCC vectors of words on the host, on scalars in CUDA kernels. (Shared-storage weights split by
// their own rule, which keeps the bits rounding drops: stowage/precision.hpp.)
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STOWAGE_BF16_FN __host__ __device__ __forceinline__
#else
#define STOWAGE_BF16_FN inline __attribute__((always_inline))
#endif

namespace stowage::bf16 {

// The bf16 bits, in the low half of each word, of the fp32 bits `u`. U is std::uint32_t or a GCC
// vector of std::uint32_t.
template <class U>
STOWAGE_BF16_FN U round_bits(const U& u) {
  const U rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const U quiet_nan = (u >> 16) | 0x40u;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded;
}

STOWAGE_BF16_FN std::uint16_t from_f32(float f) {
#if defined(__CUDA_ARCH__)
  const auto u = static_cast<std::uint32_t>(__float_as_uint(f));
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
#endif
  return static_cast<std::uint16_t>(round_bits(u));
}

STOWAGE_BF16_FN float to_f32(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

}  // namespace stowage::bf16

#undef STOWAGE_BF16_FN
